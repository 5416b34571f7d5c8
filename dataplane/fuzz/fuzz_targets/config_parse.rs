//! The config parser and validator on arbitrary YAML and JSON: never panics, and a config
//! that validates survives a JSON round trip unchanged and still validates.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sweety_config::Config;

fuzz_target!(|data: &[u8]| {
    let parsed = match data.first() {
        Some(b'{') => Config::from_json(data),
        _ => match std::str::from_utf8(data) {
            Ok(s) => Config::from_yaml(s),
            Err(_) => return,
        },
    };
    let Ok(cfg) = parsed else {
        return;
    };
    if cfg.validate_structure().is_ok() {
        let json = serde_json_roundtrip(&cfg);
        assert_eq!(json, cfg);
    }
});

fn serde_json_roundtrip(cfg: &Config) -> Config {
    let text = cfg.to_json();
    Config::from_json(&text).expect("a written config parses")
}
