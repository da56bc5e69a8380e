//! Fake `nvidia-smi`: `-r`/`--gpu-reset` with `-i`/`--id` (comma-separated bus ids, UUIDs or
//! indices), `-L`/`--list-gpus`, and `--query-gpu=<fields> --format=csv[,noheader]`; they act on
//! or read the fake NVML's JSON state (see `fake_nvml::smi`). The state file is
//! `fake-nvml.json` beside this executable, else `FAKE_NVML_CONFIG`.

use std::process::ExitCode;

use fake_nvml::{smi, state};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut reset = false;
    let mut list = false;
    let mut query: Option<Vec<String>> = None;
    let mut header = true;
    let mut ids: Vec<String> = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-r" | "--gpu-reset" => reset = true,
            "-L" | "--list-gpus" => list = true,
            "-i" | "--id" => match it.next() {
                Some(v) => ids.extend(v.split(',').map(str::to_owned)),
                None => return fail(2, "Option -i requires a value."),
            },
            other => {
                if let Some(v) = other.strip_prefix("--id=") {
                    ids.extend(v.split(',').map(str::to_owned));
                } else if let Some(v) = other.strip_prefix("--query-gpu=") {
                    query = Some(v.split(',').map(|f| f.trim().to_owned()).collect());
                } else if let Some(v) = other.strip_prefix("--format=") {
                    if !v.split(',').any(|f| f == "csv") {
                        return fail(2, "fake nvidia-smi implements only --format=csv");
                    }
                    header = !v.split(',').any(|f| f == "noheader");
                } else {
                    return fail(
                        2,
                        &format!("Invalid combination of input arguments: {other}"),
                    );
                }
            }
        }
    }
    let querying = list || query.is_some();
    if !reset && !querying {
        return fail(
            2,
            "fake nvidia-smi implements only -r -i <ids>, -L and --query-gpu",
        );
    }
    if reset && ids.is_empty() {
        return fail(2, "fake nvidia-smi: -r needs -i <ids>");
    }
    let exe = std::env::current_exe().ok();
    let path = match state::config_path_beside(exe.as_deref()) {
        Ok(p) => p,
        Err(e) => return fail(9, &e.to_string()),
    };
    if querying {
        let cfg = match state::load(&path) {
            Ok(c) => c,
            Err(e) => return fail(9, &e.to_string()),
        };
        let (out, code) = smi::query(&cfg, query.as_deref(), header);
        print!("{out}");
        return ExitCode::from(u8::try_from(code).unwrap_or(255));
    }
    let result = state::update(&path, |cfg| {
        let before = cfg.clone();
        let r = smi::gpu_reset(cfg, &ids);
        if r.is_err() {
            *cfg = before;
        }
        r
    });
    match result {
        Err(e) => fail(9, &e.to_string()),
        Ok(Ok(out)) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Ok(Err(f)) => {
            print!("{}", f.message);
            ExitCode::from(u8::try_from(f.exit_code).unwrap_or(255))
        }
    }
}

fn fail(code: u8, msg: &str) -> ExitCode {
    eprintln!("{msg}");
    ExitCode::from(code)
}
