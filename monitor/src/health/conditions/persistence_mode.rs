//! `persistence_mode`: without it the driver reinitialises for each job (slow starts and NVML
//! queries). Doctor.
use crate::health::check::{gpu_subject, Checks, Status, Window};

pub const NAME: &str = "persistence_mode";

pub fn examine(window: &Window<'_>, out: &mut Checks) {
    for g in window.readable_gpus() {
        let Some(on) = g.device.persistence_mode else {
            continue;
        };
        out.add(
            NAME,
            gpu_subject(g),
            if on { Status::Ok } else { Status::Warning },
            if on { "on" } else { "off" },
            "on",
            "Without persistence the driver reinitialises for each job (slow starts and NVML \
             queries): enable nvidia-persistenced or `nvidia-smi -pm 1`.",
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::conditions::testing::doctor_rows;
    use crate::model::test_support::{gpu, snapshot};

    #[test]
    fn off_is_a_warning_and_unknown_is_no_row() {
        let rows = |mode| {
            let mut g = gpu(0);
            g.device.persistence_mode = mode;
            doctor_rows(examine, &[snapshot(0, vec![g], vec![])])
        };
        assert_eq!(rows(Some(true)), [("GPU 0".to_owned(), Status::Ok)]);
        assert_eq!(rows(Some(false)), [("GPU 0".to_owned(), Status::Warning)]);
        assert!(rows(None).is_empty());
    }
}
