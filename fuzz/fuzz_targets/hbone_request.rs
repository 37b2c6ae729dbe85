#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| mesh_fuzz::hbone_request(data));
