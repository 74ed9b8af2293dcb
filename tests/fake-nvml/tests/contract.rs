//! The fake's C contracts, called as the agent calls them: what each utilisation query returns
//! over real time from a running driver thread, the buffer sizing the H200 driver showed, a
//! dead process computing nothing, and an injected delay that holds no lock. One test: the
//! scenario is process-wide state.
use nvidia_ml_fake::*;
use nvml_wrapper_sys::bindings::*;
use std::time::{Duration, Instant};

fn handle(i: usize) -> nvmlDevice_t {
    (i + 1) as nvmlDevice_t
}

#[test]
fn the_fake_answers_like_the_measured_driver() {
    let dir = std::env::temp_dir().join(format!("fake-nvml-contract-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    let dead_pid = dead.id();
    dead.wait().unwrap();
    let scenario = dir.join("scenario.json");
    std::fs::write(
        &scenario,
        format!(
            r#"{{"delays_ms": {{"nvmlDeviceGetTemperature": 600}},
                "devices": [
                  {{"uuid": "GPU-a", "processes": [{{"pid": {me}, "sm_util": 60}}]}},
                  {{"uuid": "GPU-b", "processes": [{{"pid": {dead_pid}, "sm_util": 90}}]}}
                ]}}"#,
            me = std::process::id()
        ),
    )
    .unwrap();
    std::env::set_var(SCENARIO_ENV, &scenario);
    assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
    std::thread::sleep(Duration::from_millis(1300));

    // SAFETY: each pointer passed is to a live local, or null where NVML's contract allows it.
    unsafe {
        // GetSamples: a null buffer asks for the count (SUCCESS); then every record.
        let (mut vt, mut n) = (0 as nvmlValueType_t, 0u32);
        let r = nvmlDeviceGetSamples(handle(0), 1, 0, &mut vt, &mut n, std::ptr::null_mut());
        assert_eq!(r, nvmlReturn_enum_NVML_SUCCESS);
        assert!((4..=7).contains(&n), "{n} records after 1.3 s at 200 ms");
        let mut buf = vec![
            nvmlSample_t {
                timeStamp: 0,
                sampleValue: nvmlValue_t { ullVal: 0 }
            };
            n as usize
        ];
        assert_eq!(
            nvmlDeviceGetSamples(handle(0), 1, 0, &mut vt, &mut n, buf.as_mut_ptr()),
            nvmlReturn_enum_NVML_SUCCESS
        );
        let ts: Vec<u64> = buf[..n as usize].iter().map(|s| s.timeStamp).collect();
        assert!(ts.windows(2).all(|w| w[1] - w[0] == 200_000), "{ts:?}");
        // The first period may have opened before the driver thread's first reading.
        assert!(buf[1..n as usize].iter().all(|s| s.sampleValue.uiVal == 60));
        let last = *ts.last().unwrap();
        let r = nvmlDeviceGetSamples(handle(0), 1, last, &mut vt, &mut n, buf.as_mut_ptr());
        assert_eq!(r, nvmlReturn_enum_NVML_ERROR_NOT_FOUND, "nothing newer");

        // GetProcessUtilization: asks for 72 entries and refuses fewer, then one entry per
        // credited process.
        let mut count = 0u32;
        let r = nvmlDeviceGetProcessUtilization(handle(0), std::ptr::null_mut(), &mut count, 0);
        assert_eq!(
            (r, count),
            (nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, 72)
        );
        let zero = nvmlProcessUtilizationSample_t {
            pid: 0,
            timeStamp: 0,
            smUtil: 0,
            memUtil: 0,
            encUtil: 0,
            decUtil: 0,
        };
        let mut p = vec![zero; 72];
        count = 64;
        let r = nvmlDeviceGetProcessUtilization(handle(0), p.as_mut_ptr(), &mut count, 0);
        assert_eq!(r, nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE);
        count = 72;
        let r = nvmlDeviceGetProcessUtilization(handle(0), p.as_mut_ptr(), &mut count, 0);
        assert_eq!((r, count), (nvmlReturn_enum_NVML_SUCCESS, 1));
        assert_eq!(p[0].pid, std::process::id());

        // A dead process computes nothing, though it is still listed.
        buf.resize(
            72,
            nvmlSample_t {
                timeStamp: 0,
                sampleValue: nvmlValue_t { ullVal: 0 },
            },
        );
        n = 72;
        let r = nvmlDeviceGetSamples(handle(1), 1, 0, &mut vt, &mut n, buf.as_mut_ptr());
        assert_eq!(r, nvmlReturn_enum_NVML_SUCCESS);
        assert!(buf[..n as usize].iter().all(|s| s.sampleValue.uiVal == 0));
        let mut listed = 0u32;
        nvmlDeviceGetComputeRunningProcesses_v3(handle(1), &mut listed, std::ptr::null_mut());
        assert_eq!(listed, 1);

        // A slow call holds no lock: another call answers meanwhile.
        let slow = std::thread::spawn(|| {
            let mut t = 0u32;
            nvmlDeviceGetTemperature(handle(0), 0, &mut t)
        });
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        let mut util = nvmlUtilization_t { gpu: 0, memory: 0 };
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(0), &mut util),
            nvmlReturn_enum_NVML_SUCCESS
        );
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(util.gpu, 60);
        assert_eq!(slow.join().unwrap(), nvmlReturn_enum_NVML_SUCCESS);

        // Initialisations are counted: calls answer until the last shutdown, then
        // UNINITIALIZED until the next init, which finds the same GPUs.
        let mut n = 0u32;
        assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlShutdown(), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(
            nvmlDeviceGetCount_v2(&mut n),
            nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(
            nvmlDeviceGetUtilizationRates(handle(0), &mut util),
            nvmlReturn_enum_NVML_ERROR_UNINITIALIZED
        );
        assert_eq!(
            nvmlShutdown(),
            nvmlReturn_enum_NVML_SUCCESS,
            "one too many: no error"
        );
        assert_eq!(nvmlInit_v2(), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(nvmlDeviceGetCount_v2(&mut n), nvmlReturn_enum_NVML_SUCCESS);
        assert_eq!(n, 2);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
