//! gpuwatch's CUDA programs: uprobes on the driver library (see [`cuda`]). An object of their
//! own, apart from the stall tracepoints, so the agent loads them only when it attaches them and
//! neither set's maps cost anything while the other alone is wanted.
#![no_std]
#![no_main]

mod cuda;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
