//! `sweety-controller`: watches the cluster, translates Ingress, Gateway API and SweetySite
//! objects into dataplane config, pushes it over the dataplane's control socket and (as the
//! elected leader) writes statuses and per-Gateway Services. Thin: flags, logging, wiring.

use anyhow::{bail, Context};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use sweety_controller::default_certificate::{self, SharedDefaultCertificate};
use sweety_controller::health::{self, Health};
use sweety_controller::leader::LeaseOptions;
use sweety_controller::metrics::Metrics;
use sweety_controller::push::{PushOptions, Pusher};
use sweety_controller::run::{run, RunOptions};
use sweety_controller::status_worker::StatusOptions;
use sweety_controller::translate::{DefaultCertificate, GatewayServiceNamespace, Params};
use sweety_controller::watch::WatchOptions;

/// mimalloc: less fragmentation and lower RSS across config reloads (e2e/bench/HISTORY.md, "Earlier measurements").
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(name = "sweety-controller", version, about)]
struct Args {
    /// A one-off command instead of running the controller.
    #[command(subcommand)]
    command: Option<Command>,
    /// Kubeconfig file; without it the in-cluster config (or the default kubeconfig) is used.
    #[arg(long, env = "SWEETY_KUBECONFIG", global = true)]
    kubeconfig: Option<PathBuf>,
    /// GatewayClass `spec.controllerName` this controller owns.
    #[arg(
        long,
        env = "SWEETY_CONTROLLER_NAME",
        default_value = "sweety.dev/gateway-controller"
    )]
    controller_name: String,
    /// IngressClass names served, comma-separated (only those whose `spec.controller` is
    /// `--ingress-controller` are served).
    #[arg(
        long,
        env = "SWEETY_INGRESS_CLASS",
        value_delimiter = ',',
        default_value = "sweety"
    )]
    ingress_class: Vec<String>,
    /// IngressClass `spec.controller` this controller owns.
    #[arg(
        long,
        env = "SWEETY_INGRESS_CONTROLLER",
        default_value = "sweety.dev/ingress-controller"
    )]
    ingress_controller: String,
    /// The controller's namespace: lease and per-Gateway Services live here.
    #[arg(long, env = "POD_NAMESPACE", default_value = "sweety")]
    namespace: String,
    /// Namespaces to watch, comma-separated; empty watches all.
    #[arg(
        long,
        env = "SWEETY_WATCH_NAMESPACES",
        value_delimiter = ',',
        default_value = ""
    )]
    watch_namespaces: Vec<String>,
    /// The dataplane's control socket.
    #[arg(
        long,
        env = "SWEETY_CONTROL_SOCKET",
        default_value = "/var/run/sweety/control.sock"
    )]
    control_socket: PathBuf,
    /// The chart's Service carrying Ingress traffic (its load-balancer status goes to every
    /// Ingress, and the per-Gateway Services mirror its endpoints, the dataplane Pods); empty
    /// for none.
    #[arg(long, env = "SWEETY_INGRESS_SERVICE", default_value = "sweety")]
    ingress_service: String,
    /// Elect a leader through a Lease; only the leader writes statuses and Services.
    #[arg(long, env = "SWEETY_LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// Name of the leader Lease.
    #[arg(long, env = "SWEETY_LEASE_NAME", default_value = "sweety-controller")]
    lease_name: String,
    /// ServiceAccount (in the controller's namespace) set as the owner of the leader Lease and
    /// of the shared default-certificate Secret, so that they are deleted with the
    /// installation; empty for none.
    #[arg(long, env = "SWEETY_LEASE_OWNER_SERVICE_ACCOUNT", default_value = "")]
    lease_owner_service_account: String,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "SWEETY_METRICS_ADDRESS", default_value = "127.0.0.1:9090")]
    metrics_address: SocketAddr,
    /// Dataplane container ports for Gateway listeners, `MIN-MAX`.
    #[arg(long, env = "SWEETY_GATEWAY_PORT_RANGE", default_value = "20000-29999")]
    gateway_port_range: String,
    /// Type of the Service created for each Gateway: `LoadBalancer`, `NodePort` or `ClusterIP`
    /// (a GatewayClass's SweetyProxyConfig `service.type` overrides it for its Gateways).
    #[arg(
        long,
        env = "SWEETY_GATEWAY_SERVICE_TYPE",
        default_value = "LoadBalancer",
        value_parser = ["LoadBalancer", "NodePort", "ClusterIP"]
    )]
    gateway_service_type: String,
    /// Where the per-Gateway Services live: `release` (this controller's namespace, beside
    /// the dataplane Pods; Services are written there only) or `gateway` (each Gateway's
    /// namespace, selector-less with mirrored EndpointSlices; needs write access to Services
    /// and EndpointSlices there). See docs/security.md "Multi-tenant guarantees".
    #[arg(
        long,
        env = "SWEETY_GATEWAY_SERVICE_NAMESPACE",
        default_value = "release",
        value_parser = ["release", "gateway"]
    )]
    gateway_service_namespace: String,
    /// Directory shared with the dataplane for static content.
    #[arg(
        long,
        env = "SWEETY_CONTENT_DIR",
        default_value = "/var/run/sweety/content"
    )]
    content_dir: String,
    /// Coalescing window for watch events, e.g. `20ms` or `1s`: a change is reconciled as soon
    /// as it is seen, and so are the next few (4) in quick succession; past those, a burst
    /// costs one reconcile per window.
    #[arg(long, env = "SWEETY_DEBOUNCE", default_value = "20ms")]
    debounce: String,
    /// The cluster-wide default backend of Ingress, `namespace/service:port` (requests for
    /// unknown hosts and unmatched paths); empty for none (404). An Ingress's
    /// `spec.defaultBackend` only covers that Ingress's own hosts.
    #[arg(long, env = "SWEETY_DEFAULT_BACKEND", default_value = "")]
    default_backend: String,
    /// A `kubernetes.io/tls` Secret, `namespace/name`, served on the Ingress HTTPS listener to
    /// connections without SNI or with a name no certificate covers; read at start, and
    /// followed (a rotated Secret is served without a
    /// restart). Empty: the self-signed certificate of `--generated-default-certificate`.
    #[arg(long, env = "SWEETY_DEFAULT_CERTIFICATE", default_value = "")]
    default_certificate: String,
    /// Without `--default-certificate`: the `kubernetes.io/tls` Secret in the controller's
    /// namespace holding the self-signed default certificate made once and served by every
    /// replica (created when absent; an unusable one is reported and replaced by the leader;
    /// owned by `--lease-owner-service-account`). Empty: each replica makes its own at start
    /// (replicas then serve different certificates). Empty by default: the chart names the
    /// Secret and grants the Role it needs; a controller run by an older chart (no such Role)
    /// must not wait on a Secret it may not create.
    #[arg(long, env = "SWEETY_GENERATED_DEFAULT_CERTIFICATE", default_value = "")]
    generated_default_certificate: String,
    /// Namespaces whose Ingresses may share hostnames (ingress-nginx's merge), comma-separated.
    /// A Namespace can also opt in with the annotation `sweety.dev/share-hosts: "true"`.
    #[arg(
        long,
        env = "SWEETY_SHARED_HOST_NAMESPACES",
        value_delimiter = ',',
        default_value = ""
    )]
    shared_host_namespaces: Vec<String>,
    /// Hostnames pinned to namespaces, `namespace=host|*.suffix[|...]` entries, comma-separated
    /// (never served from another namespace). A Namespace can also pin with the annotation
    /// `sweety.dev/pinned-hostnames`.
    #[arg(
        long,
        env = "SWEETY_PINNED_HOSTNAMES",
        value_delimiter = ',',
        default_value = ""
    )]
    pinned_hostnames: Vec<String>,
    /// Serve Ingress paths whose security annotations are not implemented (auth-*,
    /// modsecurity, …) WITHOUT that protection, instead of answering 403.
    #[arg(
        long,
        env = "SWEETY_IGNORE_UNSUPPORTED_SECURITY_ANNOTATIONS",
        default_value_t = false
    )]
    ignore_unsupported_security_annotations: bool,
    /// Serve Ingresses carrying `*-snippet` annotations without the snippet, instead of
    /// refusing them (503).
    #[arg(long, env = "SWEETY_IGNORE_SNIPPETS", default_value_t = false)]
    ignore_snippets: bool,
    /// Redirect plain-HTTP requests for Ingress hosts with TLS to HTTPS unless an Ingress says
    /// `nginx.ingress.kubernetes.io/ssl-redirect: "false"` (ingress-nginx's default).
    #[arg(long, env = "SWEETY_SSL_REDIRECT", default_value_t = true, action = clap::ArgAction::Set)]
    ssl_redirect: bool,
    /// Path prefixes never redirected to HTTPS, comma-separated (ingress-nginx's
    /// `no-tls-redirect-locations`).
    #[arg(
        long,
        env = "SWEETY_NO_TLS_REDIRECT_LOCATIONS",
        value_delimiter = ',',
        default_value = "/.well-known/acme-challenge"
    )]
    no_tls_redirect_locations: Vec<String>,
    /// `Strict-Transport-Security` max-age (seconds) on HTTPS responses of Ingress hosts with
    /// TLS; 0 sends no header.
    #[arg(long, env = "SWEETY_HSTS_MAX_AGE", default_value_t = 31_536_000)]
    hsts_max_age: u64,
    /// HSTS `includeSubDomains`.
    #[arg(long, env = "SWEETY_HSTS_INCLUDE_SUBDOMAINS", default_value_t = true, action = clap::ArgAction::Set)]
    hsts_include_subdomains: bool,
    /// HSTS `preload`.
    #[arg(long, env = "SWEETY_HSTS_PRELOAD", default_value_t = false, action = clap::ArgAction::Set)]
    hsts_preload: bool,
    /// Follow ExternalName Services as backends. Off: such backends answer 503. On, the
    /// dataplane still refuses loopback, link-local, metadata and its own addresses.
    #[arg(long, env = "SWEETY_ALLOW_EXTERNAL_NAME", default_value_t = false)]
    allow_external_name: bool,
    /// Status writes in flight at once (the status worker; config pushes never wait for it).
    #[arg(long, env = "SWEETY_STATUS_CONCURRENCY", default_value_t = 8)]
    status_concurrency: usize,
    /// Client-side rate limit of status writes: writes per second.
    #[arg(long, env = "SWEETY_STATUS_QPS", default_value_t = 500.0)]
    status_qps: f64,
    /// Client-side rate limit of status writes: burst size.
    #[arg(long, env = "SWEETY_STATUS_BURST", default_value_t = 500)]
    status_burst: u32,
}

/// `namespace=pattern|pattern` entries of `--pinned-hostnames`.
fn parse_pins(
    entries: &[String],
) -> anyhow::Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut out: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for e in entries.iter().filter(|e| !e.trim().is_empty()) {
        let (ns, patterns) = e.split_once('=').with_context(|| {
            format!("--pinned-hostnames entry {e:?}: use namespace=host|*.suffix")
        })?;
        out.entry(ns.trim().to_string()).or_default().extend(
            patterns
                .split('|')
                .map(|p| p.trim().to_string())
                .filter(|p| !p.is_empty()),
        );
    }
    Ok(out)
}

/// The configured default-certificate Secret's certificate (`namespace/name`), as read now,
/// when the dataplane can serve it ([`default_certificate::check`], as the translation checks
/// the Secret it follows).
async fn configured_default_certificate(
    client: &kube::Client,
    secret: &str,
) -> anyhow::Result<DefaultCertificate> {
    let (ns, name) = secret
        .split_once('/')
        .context("--default-certificate: use namespace/name")?;
    let api: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let s = api
        .get(name)
        .await
        .with_context(|| format!("read the default certificate Secret {secret}"))?;
    default_certificate::check(&s)
        .map_err(|why| anyhow::anyhow!("the default certificate Secret {secret}: {why}"))
}

/// A string flag: `None` when empty.
fn non_empty(s: &str) -> Option<String> {
    Some(s).filter(|s| !s.is_empty()).map(str::to_string)
}

/// A comma-separated flag's entries, without empty ones (`a,,b`, or the empty default).
fn entries(list: Vec<String>) -> Vec<String> {
    list.into_iter().filter(|e| !e.is_empty()).collect()
}

fn parse_duration(s: &str) -> anyhow::Result<Duration> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().with_context(|| format!("duration {s:?}"))?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        _ => bail!("duration {s:?}: use ms or s"),
    })
}

fn parse_port_range(s: &str) -> anyhow::Result<(u16, u16)> {
    let (a, b) = s.split_once('-').context("port range must be MIN-MAX")?;
    let (a, b): (u16, u16) = (a.trim().parse()?, b.trim().parse()?);
    if a < 1024 || a > b {
        bail!("port range {s:?}: need 1024 <= MIN <= MAX");
    }
    Ok((a, b))
}

async fn client(kubeconfig: Option<&PathBuf>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?
        }
        None => kube::Config::infer().await?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

#[derive(clap::Subcommand, Debug)]
enum Command {
    /// Read-only: what Sweety would do with every Ingress of the cluster (any class), per
    /// `nginx.ingress.kubernetes.io/*` annotation: honoured, honoured differently, refused
    /// (fail closed) or ignored. Lists Ingresses and reads the Secrets they name; writes nothing.
    MigrateReport {
        /// `table` or `json`.
        #[arg(long, default_value = "table", value_parser = ["table", "json"])]
        output: String,
        /// Only this namespace (default: all).
        #[arg(long)]
        namespace: Option<String>,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // Colour only on a terminal (and never with NO_COLOR): piped to a file or a log
        // collector, escape codes are noise in every line (issue 21).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stdout())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .init();
    let args = Args::parse();
    if let Some(Command::MigrateReport { output, namespace }) = &args.command {
        let client = client(args.kubeconfig.as_ref()).await?;
        let params = Params {
            ignore_unsupported_security_annotations: args.ignore_unsupported_security_annotations,
            ignore_snippets: args.ignore_snippets,
            ..Params::default()
        };
        let reports =
            sweety_controller::migrate_report::collect(&client, namespace.as_deref(), &params)
                .await?;
        let text = if output == "json" {
            serde_json::to_string_pretty(&reports)? + "\n"
        } else {
            sweety_controller::migrate_report::table(&reports)
        };
        use std::io::Write as _;
        return match std::io::stdout().lock().write_all(text.as_bytes()) {
            // `| head`: the reader has what it wanted.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => Ok(r?),
        };
    }
    let (gateway_port_min, gateway_port_max) = parse_port_range(&args.gateway_port_range)?;
    let debounce = parse_duration(&args.debounce)?;
    let params = Params {
        controller_name: args.controller_name,
        ingress_classes: args
            .ingress_class
            .into_iter()
            .map(|c| c.trim().to_string())
            .filter(|c| !c.is_empty())
            .collect(),
        ingress_controller: args.ingress_controller,
        namespace: args.namespace.clone(),
        ingress_service: non_empty(&args.ingress_service),
        gateway_port_min,
        gateway_port_max,
        content_dir: args.content_dir,
        default_backend: non_empty(&args.default_backend),
        default_certificate_secret: non_empty(&args.default_certificate),
        shared_host_namespaces: entries(args.shared_host_namespaces),
        pinned_hostnames: parse_pins(&args.pinned_hostnames)?,
        ignore_unsupported_security_annotations: args.ignore_unsupported_security_annotations,
        ignore_snippets: args.ignore_snippets,
        ssl_redirect: args.ssl_redirect,
        no_tls_redirect_locations: entries(args.no_tls_redirect_locations),
        hsts_max_age: args.hsts_max_age,
        hsts_include_subdomains: args.hsts_include_subdomains,
        hsts_preload: args.hsts_preload,
        allow_external_name: args.allow_external_name,
        gateway_service_type: args.gateway_service_type,
        gateway_service_namespace: args
            .gateway_service_namespace
            .parse()
            .map_err(anyhow::Error::msg)?,
        ..Params::default()
    };
    let gateway_services_namespace = (params.gateway_service_namespace
        == GatewayServiceNamespace::Release)
        .then(|| args.namespace.clone());
    let mut options = RunOptions {
        params,
        watch: WatchOptions {
            namespaces: entries(args.watch_namespaces),
            dataplane_service: non_empty(&args.ingress_service)
                .map(|s| (args.namespace.clone(), s)),
            gateway_services_namespace,
            default_certificate_secret: args
                .default_certificate
                .split_once('/')
                .map(|(ns, name)| (ns.to_string(), name.to_string())),
            ..WatchOptions::default()
        },
        debounce,
        lease: args.leader_elect.then(|| LeaseOptions {
            owner_service_account: non_empty(&args.lease_owner_service_account),
            ..LeaseOptions::new(&args.namespace, &args.lease_name)
        }),
        initial_sync_timeout: Duration::from_secs(60),
        status: StatusOptions {
            concurrency: args.status_concurrency.clamp(1, 256),
            qps: args.status_qps,
            burst: args.status_burst,
            ..StatusOptions::default()
        },
        shared_default_certificate: None,
    };
    let client = client(args.kubeconfig.as_ref()).await?;
    if !args.default_certificate.is_empty() {
        options.params.default_certificate = Some(
            match configured_default_certificate(&client, &args.default_certificate).await {
                Ok(c) => c,
                Err(e) => {
                    // Still never a tenant's certificate: a generated one until the Secret is
                    // usable (it is followed) or a restart reads it.
                    tracing::error!(error = %format!("{e:#}"), "default certificate; using a generated self-signed one");
                    default_certificate::generate()?
                }
            },
        );
    } else if !args.generated_default_certificate.is_empty() {
        // Made once, kept in a Secret, served by every replica (run() reads or creates it).
        options.shared_default_certificate = Some(SharedDefaultCertificate {
            owner_service_account: non_empty(&args.lease_owner_service_account),
            ..SharedDefaultCertificate::new(&args.namespace, &args.generated_default_certificate)
        });
    } else {
        options.params.default_certificate = Some(default_certificate::generate()?);
    }
    let health = Health::new(Arc::new(Metrics::default()));
    let (addr, _server) = health::serve(args.metrics_address, health.clone()).await?;
    tracing::info!(%addr, "serving /metrics, /healthz and /readyz");
    let pusher = Pusher::spawn(PushOptions {
        socket: args.control_socket,
        ..PushOptions::default()
    });
    run(client, options, pusher, health, shutdown_signal()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_parsers() {
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("2h").is_err());
        assert_eq!(parse_port_range("20000-20010").unwrap(), (20000, 20010));
        assert!(parse_port_range("80-90").is_err());
        let pins =
            parse_pins(&["shop=shop.test|*.shop.test".into(), "bank=bank.test".into()]).unwrap();
        assert_eq!(pins["shop"], ["shop.test", "*.shop.test"]);
        assert_eq!(pins["bank"], ["bank.test"]);
        assert!(parse_pins(&["no-equals".into()]).is_err());
        assert_eq!(non_empty(""), None);
        assert_eq!(non_empty("sweety").as_deref(), Some("sweety"));
        assert_eq!(
            entries(vec!["a".into(), String::new(), "b".into()]),
            ["a", "b"]
        );
        Args::try_parse_from([
            "sweety-controller",
            "--leader-elect",
            "--watch-namespaces",
            "a,b",
        ])
        .unwrap();
    }
}
