//! The embedded default config, served when `sweety-dataplane` runs without `--config`:
//!
//! * `http://127.0.0.1:8080/`: a demo static page (written to a temporary directory at start);
//! * `http://127.0.0.1:8080/admin/…`: an example proxy route to the admin listener
//!   (try `/admin/metrics`), showing the reverse proxy with a prefix rewrite;
//! * `https://127.0.0.1:8443/`: the same over TLS (HTTP/1.1 and HTTP/2) with a self-signed
//!   certificate made at start for `localhost` and `127.0.0.1`;
//! * the admin listener on `127.0.0.1:9901`.

use std::path::{Path, PathBuf};
use sweety_config::*;

/// The demo page.
pub const INDEX_HTML: &str = r#"<!doctype html>
<html lang="en">
<head><meta charset="utf-8"><title>Sweety</title>
<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:4rem auto;line-height:1.5;padding:0 1rem}code{background:#f3f3f3;padding:.1rem .3rem}</style>
</head>
<body>
<h1>Sweety is running</h1>
<p>This page is a static file served by the Sweety dataplane from its embedded default config.</p>
<ul>
<li><a href="/admin/metrics"><code>/admin/metrics</code></a>: a reverse-proxy route to the admin listener's metrics.</li>
<li><a href="/admin/config"><code>/admin/config</code></a>: the generation and hash of the config being served.</li>
<li>HTTPS with HTTP/2: <code>curl -k https://127.0.0.1:8443/</code></li>
</ul>
<p>Run your own config with <code>sweety-dataplane run --config FILE</code>; examples are in <code>deploy/examples/</code>.</p>
</body>
</html>
"#;

/// Writes the demo site into `dir` and returns its path.
pub fn write_demo_site(dir: &Path) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("index.html"), INDEX_HTML)?;
    Ok(dir.to_path_buf())
}

/// The default config, serving `site_root`, with the given self-signed certificate PEMs.
pub fn default_config(site_root: &Path, cert_pem: String, key_pem: String) -> Config {
    let admin = Admin::default();
    Config {
        generation: 1,
        listeners: vec![
            Listener {
                name: "http".into(),
                address: "127.0.0.1".into(),
                port: 8080,
                protocol: ListenerProtocol::Http,
                tls: None,
                http3: true,
                max_requests_in_flight: None,
                advertised_port: None,
                l4_routes: vec![],
            },
            Listener {
                name: "https".into(),
                address: "127.0.0.1".into(),
                port: 8443,
                protocol: ListenerProtocol::Https,
                tls: Some(ListenerTls {
                    certificates: vec![Certificate {
                        hostnames: vec![],
                        cert: PemSource::Pem(cert_pem),
                        key: PemSource::Pem(key_pem),
                    }],
                    min_version: TlsVersion::Tls12,
                    client_auth: None,
                    host_client_auth: Vec::new(),
                }),
                http3: true,
                max_requests_in_flight: None,
                advertised_port: None,
                l4_routes: vec![],
            },
        ],
        virtual_hosts: vec![VirtualHost {
            name: "demo".into(),
            hostnames: vec![],
            listeners: vec![],
            routes: vec![
                Route {
                    name: "admin-proxy".into(),
                    matches: vec![RouteMatch {
                        path: Some(PathMatch::Prefix("/admin".into())),
                        ..Default::default()
                    }],
                    filters: vec![Filter::Rewrite(UrlRewrite {
                        host: None,
                        path: Some(PathRewrite::Prefix("/".into())),
                    })],
                    action: Action::Proxy(ProxyAction {
                        backends: vec![WeightedBackend {
                            backend: "admin".into(),
                            weight: 1,
                            filters: vec![],
                        }],
                    }),
                    timeouts: Timeouts::default(),
                    retry: None,
                    max_request_body_bytes: None,
                },
                Route {
                    name: "site".into(),
                    matches: vec![],
                    filters: vec![],
                    action: Action::Static(StaticSite {
                        root: site_root.to_path_buf(),
                        index: vec!["index.html".into()],
                        try_files: vec![],
                        precompressed: true,
                        cache_control: Some("no-cache".into()),
                        strip_prefix: None,
                        hide_dotfiles: true,
                    }),
                    timeouts: Timeouts::default(),
                    retry: None,
                    max_request_body_bytes: None,
                },
            ],
        }],
        backends: vec![Backend {
            name: "admin".into(),
            protocol: BackendProtocol::Http1,
            tls: None,
            lb: LbPolicy::RoundRobin,
            endpoints: vec![Endpoint {
                address: format!("{}:{}", admin.address, admin.port),
                weight: 1,
            }],
            connect_timeout: Duration::from_secs(2),
            outlier: OutlierDetection::default(),
            max_idle_per_endpoint: 8,
            ..Backend::new("admin", Vec::new())
        }],
        admin: Some(admin),
        ..Config::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let root = write_demo_site(dir.path()).unwrap();
        let (c, k) = crate::tls::self_signed(&["localhost", "127.0.0.1"]).unwrap();
        let cfg = default_config(&root, c, k);
        cfg.validate().unwrap();
        assert!(root.join("index.html").exists());
    }
}
