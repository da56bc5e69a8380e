//! fake-nvml: a stand-in for `libnvidia-ml.so.1` and `nvidia-smi`, for bcd's tests.
//!
//! # Background
//!
//! bcd's GPU checks (`diag.nvml`, the XID watch, `gpu.reset`) talk to NVML through nvml-wrapper,
//! which `dlopen`s the library and resolves each C function lazily. No test machine has a GPU, so
//! this crate builds a `cdylib` exporting the NVML functions bcd calls, answering from a JSON
//! description of a node's GPUs ([`config::FakeConfig`]), and a fake `nvidia-smi` binary whose
//! `-r -i <ids>` resets GPUs in that description and whose `-L` / `--query-gpu` list them
//! ([`smi`]). Besides health counters it can describe a GPU that fell off the bus (`lost`: its
//! handle fails with `NVML_ERROR_GPU_IS_LOST`) and GPUs in MIG mode with their MIG devices.
//!
//! # Design
//!
//! The JSON file is the state: every call re-reads it and every change (persistence mode, a
//! delivered XID, a reset) is written back atomically, so the library in the daemon's process
//! sees what the fake `nvidia-smi` did in another. The file is `fake-nvml.json` beside the
//! loaded library (or beside the `nvidia-smi` executable), else the file `FAKE_NVML_CONFIG`
//! names ([`state`]). Tests in one process each copy the library into their own directory, so
//! every copy has its own globals and its own file.
//!
//! # Limitations
//!
//! Only the functions bcd calls exist (an unknown one fails to resolve, which nvml-wrapper
//! reports as `FailedToLoadSymbol`). Only XID events are delivered. Concurrent writers of the
//! same file can lose an update (last rename wins); tests drive one writer at a time.

pub mod config;
mod ffi;
pub mod smi;
pub mod state;
