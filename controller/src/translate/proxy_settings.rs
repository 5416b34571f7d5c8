//! Dataplane-wide settings from the SweetyProxyConfigs our classes point at.
//!
//! A GatewayClass of ours (`spec.parametersRef`) and an IngressClass we serve
//! (`spec.parameters`, scope `Namespace`) may each name a SweetyProxyConfig. One dataplane
//! serves every class, so its limits, access log and client-address settings are one set:
//!
//! - **limits**: for each field, the smallest value any config in effect sets wins (the most
//!   restrictive; unset fields keep the dataplane defaults of docs/config.md);
//! - **logging.accessLog**: on when any config says on, off only when those that say something
//!   all say off; **logging.format** `text` (the ingress-nginx-like `combined` line) only when
//!   every config that names a format says text, else JSON;
//! - **tracing**: applied only when every config that sets it sets the same; on a
//!   disagreement, or when the one set is invalid, tracing stays off (it sends request data
//!   to a third party: nobody gets it by outvoting another config) and each config involved
//!   says so;
//! - **clientIp.trustedProxies**: applied only when every config that sets it sets the same
//!   set; on a disagreement no proxy is trusted (the peer address is the client: fail
//!   closed) and each config involved says so; `forwardedForDepth`: the smallest.
//!
//! Each config in effect gets an `Accepted` condition (a `Conditions` status: logged and
//! published as Events) naming the classes that use it and every field where another
//! config's value applies instead of its own; an invalid value (a duration that does not
//! parse, an address that is not a CIDR) is left out and named there too. An IngressClass we
//! serve whose `parameters` name anything else gets a condition saying they are ignored.
//! Pure: a function of the snapshot and the params, used by `translate` and by the
//! incremental translation alike.

use super::ingress::nginx::ClassSettings;
use super::ingress::served_classes;
use super::snapshot::{Snapshot, CA_KEY};
use super::status::{Condition, ObjectKey, ObjectStatus};
use super::Params;
use std::collections::{BTreeMap, BTreeSet};
use sweety_config::{AccessLogFormat, Config, Duration, PemSource};
use sweety_crds::proxy_config::LogFormat;
use sweety_crds::SweetyProxyConfig;

/// The API group of SweetyProxyConfig (also what a GatewayClass's `parametersRef` names).
pub(crate) const GROUP: &str = "sweety.dev";
/// The kind.
pub(crate) const KIND: &str = "SweetyProxyConfig";

/// The SweetyProxyConfig `namespace/name`, if the snapshot has it.
pub(crate) fn find<'s>(
    snapshot: &'s Snapshot,
    ns: &str,
    name: &str,
) -> Option<&'s SweetyProxyConfig> {
    snapshot
        .proxy_configs
        .iter()
        .find(|c| {
            c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name)
        })
        .map(|c| c.as_ref())
}

/// The `ingress` settings of the SweetyProxyConfig that `ing`'s IngressClass names in
/// `spec.parameters` (as [`settings`] accepts such a reference), with ingress-nginx's defaults
/// for what it does not set (503 for both limit statuses, 60 s read and send idle clocks, the
/// backend's connect timeout). The class is the one
/// `spec.ingressClassName` names, else the legacy `kubernetes.io/ingress.class` annotation's,
/// else the default class among those served. A status outside 400-599 (the CRD's schema
/// refuses it; an old schema may not) is left at the default and named in the config's
/// `Accepted` condition ([`Merge::add`]).
pub(crate) fn ingress_settings(
    snapshot: &Snapshot,
    params: &Params,
    ing: &k8s_openapi::api::networking::v1::Ingress,
) -> ClassSettings {
    let mut out = ClassSettings::default();
    let served = served_classes(snapshot, params);
    let named = ing
        .spec
        .as_ref()
        .and_then(|s| s.ingress_class_name.as_deref())
        .or_else(|| {
            ing.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::ingress::LEGACY_CLASS_ANNOTATION))
                .map(String::as_str)
        });
    let class = match named {
        Some(name) => served
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name)),
        None => served.iter().find(|c| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(super::ingress::DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|v| v == "true")
        }),
    };
    let Some(p) = class.and_then(|c| c.spec.as_ref()?.parameters.as_ref()) else {
        return out;
    };
    if p.api_group.as_deref() != Some(GROUP)
        || p.kind != KIND
        || p.scope.as_deref() != Some("Namespace")
    {
        return out;
    }
    let Some(ns) = p.namespace.as_deref() else {
        return out;
    };
    let Some(i) = find(snapshot, ns, &p.name).and_then(|c| c.spec.ingress.as_ref()) else {
        return out;
    };
    let status = |v: Option<i32>| {
        v.and_then(|n| u16::try_from(n).ok())
            .filter(|n| sweety_config::check_limit_status(*n).is_ok())
    };
    if let Some(s) = status(i.limit_req_status_code) {
        out.limit_req_status = s;
    }
    if let Some(s) = status(i.limit_conn_status_code) {
        out.limit_conn_status = s;
    }
    out.ssl_passthrough = i.ssl_passthrough == Some(true);
    for (field, v, slot) in [
        (
            "ingress.proxyReadTimeout",
            &i.proxy_read_timeout,
            &mut out.proxy_timeouts.read_idle,
        ),
        (
            "ingress.proxySendTimeout",
            &i.proxy_send_timeout,
            &mut out.proxy_timeouts.send_idle,
        ),
        (
            "ingress.proxyConnectTimeout",
            &i.proxy_connect_timeout,
            &mut out.proxy_timeouts.connect,
        ),
    ] {
        if let Ok(Some(d)) = proxy_timeout(field, v.as_ref()) {
            *slot = Some(d);
        }
    }
    out
}

/// An `ingress.proxy*Timeout` value: a positive duration of at most a day (as the
/// annotations and the config bound route idle clocks), or why it is left out.
fn proxy_timeout(field: &str, v: Option<&String>) -> Result<Option<Duration>, String> {
    let Some(text) = v else { return Ok(None) };
    match text.parse::<Duration>() {
        Ok(d) if !d.is_zero() && d <= sweety_config::MAX_IDLE_TIMEOUT => Ok(Some(d)),
        _ => Err(format!(
            "{field} {text:?} is not a duration from 1ms to 24h like 60s: the default applies"
        )),
    }
}

/// The settings part of the config (no listeners, virtual hosts or backends) and the statuses
/// of the SweetyProxyConfigs in effect and of IngressClasses with parameters we ignore.
pub fn settings(snapshot: &Snapshot, params: &Params) -> (Config, Vec<(ObjectKey, ObjectStatus)>) {
    let mut statuses = Vec::new();
    // (namespace, name) → who refers to it.
    let mut users: BTreeMap<(&str, &str), Vec<String>> = BTreeMap::new();
    let mut classes: Vec<_> = snapshot
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == params.controller_name)
        .collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for class in classes {
        // (classes::translate sets the GatewayClass's own condition for a bad or missing
        // reference.)
        let Some(p) = class.spec.parameters_ref.as_ref() else {
            continue;
        };
        if let (GROUP, KIND, Some(ns)) = (p.group.as_str(), p.kind.as_str(), p.namespace.as_deref())
        {
            let class = class.metadata.name.as_deref().unwrap_or_default();
            users
                .entry((ns, p.name.as_str()))
                .or_default()
                .push(format!("GatewayClass {class}"));
        }
    }
    for class in served_classes(snapshot, params) {
        let name = class.metadata.name.as_deref().unwrap_or_default();
        let Some(p) = class.spec.as_ref().and_then(|s| s.parameters.as_ref()) else {
            continue;
        };
        let ours = p.api_group.as_deref() == Some(GROUP) && p.kind == KIND;
        let problem = match (ours, p.scope.as_deref(), p.namespace.as_deref()) {
            (true, Some("Namespace"), Some(ns)) => match find(snapshot, ns, &p.name) {
                Some(_) => {
                    users
                        .entry((ns, p.name.as_str()))
                        .or_default()
                        .push(format!("IngressClass {name}"));
                    continue;
                }
                None => format!("{KIND} {ns}/{} not found", p.name),
            },
            _ => format!(
                "spec.parameters must name a {KIND} of group {GROUP} with scope Namespace and a \
                 namespace; got kind {:?} of group {:?} (scope {:?})",
                p.kind,
                p.api_group.as_deref().unwrap_or(""),
                p.scope.as_deref().unwrap_or("Cluster")
            ),
        };
        statuses.push((
            ObjectKey::new("IngressClass", "", name),
            ObjectStatus::Conditions(vec![Condition::new(
                "Accepted",
                false,
                "InvalidParameters",
                format!("{problem}: ignored, the dataplane-wide settings apply"),
                class.metadata.generation.unwrap_or(0),
            )]),
        ));
    }
    let configs: Vec<(&SweetyProxyConfig, Vec<String>)> = users
        .into_iter()
        .filter_map(|((ns, name), users)| find(snapshot, ns, name).map(|c| (c, users)))
        .collect();
    let mut merge = Merge {
        snapshot: Some(snapshot),
        ..Merge::default()
    };
    for (i, (c, _)) in configs.iter().enumerate() {
        merge.add(i, c);
    }
    let config = merge.config();
    for (i, (c, users)) in configs.iter().enumerate() {
        let mut message = format!("dataplane-wide settings of {}", users.join(", "));
        for n in merge.notes.get(&i).into_iter().flatten() {
            message.push_str("; ");
            message.push_str(n);
        }
        let (ok, reason) = match merge.trust_conflict.contains(&i) {
            true => (false, "Conflicted"),
            false => (true, "Accepted"),
        };
        let key = ObjectKey::new(
            KIND,
            c.metadata.namespace.as_deref().unwrap_or_default(),
            c.metadata.name.as_deref().unwrap_or_default(),
        );
        let generation = c.metadata.generation.unwrap_or(0);
        let condition = Condition::new("Accepted", ok, reason, message, generation);
        statuses.push((key, ObjectStatus::Conditions(vec![condition])));
    }
    (config, statuses)
}

/// The changes from `prev` to `now` (both as [`settings`] gives them) as the incremental
/// translation records them: set (Some) or removed (None).
pub fn status_changes(
    prev: &[(ObjectKey, ObjectStatus)],
    now: &[(ObjectKey, ObjectStatus)],
    out: &mut Vec<(ObjectKey, Option<ObjectStatus>)>,
) {
    for (key, _) in prev {
        if !now.iter().any(|(k, _)| k == key) {
            out.push((key.clone(), None));
        }
    }
    for (key, status) in now {
        if !prev.iter().any(|(k, s)| k == key && s == status) {
            out.push((key.clone(), Some(status.clone())));
        }
    }
}

/// A `<ns>/<name>` label of a config (messages).
fn label(c: &SweetyProxyConfig) -> String {
    format!(
        "{KIND} {}/{}",
        c.metadata.namespace.as_deref().unwrap_or_default(),
        c.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A "smallest wins" setting's value: a count or a duration (each field has one kind).
#[derive(Clone, Copy, PartialEq, PartialOrd)]
enum Value {
    Count(u64),
    Time(Duration),
}

/// The merge of the configs in effect, in order (see the module docs).
#[derive(Default)]
struct Merge<'a> {
    /// Where the configs' references (tracing's CA ConfigMap and client Secret) are read.
    snapshot: Option<&'a Snapshot>,
    configs: Vec<&'a SweetyProxyConfig>,
    /// Per "smallest wins" field (`limits.maxConnections`, ...): the smallest value and the
    /// config it came from (ties keep the earlier config).
    smallest: BTreeMap<&'static str, (Value, usize)>,
    /// Every (config, field, value as written) offered, to say afterwards who lost.
    offered: Vec<(usize, &'static str, String)>,
    access_log: Option<bool>,
    /// `logging.format` by config.
    formats: Vec<(usize, LogFormat)>,
    /// `clientIp.trustedProxies` by config, as normalised CIDRs.
    trusted: Vec<(usize, BTreeSet<String>)>,
    /// The configs whose trusted proxies disagree (all that set them, or none).
    trust_conflict: BTreeSet<usize>,
    /// `tracing` by config.
    tracing: Vec<(usize, &'a sweety_crds::proxy_config::TracingSpec)>,
    /// Per config: fields where its value does not apply, and why.
    notes: BTreeMap<usize, Vec<String>>,
}

impl<'a> Merge<'a> {
    fn note(&mut self, i: usize, text: String) {
        self.notes.entry(i).or_default().push(text);
    }

    /// Config `i` sets `field` to `value` (written `text`).
    fn offer(&mut self, i: usize, field: &'static str, value: Value, text: String) {
        self.offered.push((i, field, text));
        match self.smallest.get(field) {
            Some((v, _)) if *v <= value => {}
            _ => {
                self.smallest.insert(field, (value, i));
            }
        }
    }

    /// A positive count, or a note saying why it is left out.
    fn count(&mut self, i: usize, field: &'static str, v: Option<i64>) {
        let Some(v) = v else { return };
        match u64::try_from(v) {
            Ok(n) if n > 0 => self.offer(i, field, Value::Count(n), v.to_string()),
            _ => self.note(i, format!("{field} {v} is not a positive number: left out")),
        }
    }

    /// A non-zero duration, or a note saying why it is left out.
    fn time(&mut self, i: usize, field: &'static str, v: Option<&String>) {
        let Some(text) = v else { return };
        match text.parse::<Duration>() {
            Ok(d) if !d.is_zero() => self.offer(i, field, Value::Time(d), text.clone()),
            _ => self.note(
                i,
                format!("{field} {text:?} is not a duration like 30s: left out"),
            ),
        }
    }

    fn add(&mut self, i: usize, c: &'a SweetyProxyConfig) {
        self.configs.push(c);
        if let Some(l) = &c.spec.limits {
            self.count(i, "limits.maxConnections", l.max_connections);
            self.count(i, "limits.maxRequestsInFlight", l.max_requests_in_flight);
            self.count(i, "limits.maxRequestBodyBytes", l.max_request_body_bytes);
            self.time(
                i,
                "limits.headerReadTimeout",
                l.header_read_timeout.as_ref(),
            );
            self.time(i, "limits.idleTimeout", l.idle_timeout.as_ref());
            self.time(i, "limits.bodyIdleTimeout", l.body_idle_timeout.as_ref());
            self.time(i, "limits.drainTimeout", l.drain_timeout.as_ref());
        }
        if let Some(logging) = &c.spec.logging {
            if let Some(on) = logging.access_log {
                self.access_log = Some(self.access_log.unwrap_or(false) || on);
            }
            if let Some(f) = logging.format {
                self.formats.push((i, f));
            }
        }
        if let Some(t) = &c.spec.tracing {
            self.tracing.push((i, t));
        }
        if let Some(ing) = &c.spec.ingress {
            for (field, v) in [
                ("ingress.limitReqStatusCode", ing.limit_req_status_code),
                ("ingress.limitConnStatusCode", ing.limit_conn_status_code),
            ] {
                let bad = v.is_some_and(|n| {
                    u16::try_from(n).map_or(true, |n| sweety_config::check_limit_status(n).is_err())
                });
                if bad {
                    self.note(
                        i,
                        format!(
                            "{field} {} is not a status from 400 to 599: 503 applies",
                            v.unwrap_or_default()
                        ),
                    );
                }
            }
            for (field, v) in [
                ("ingress.proxyReadTimeout", &ing.proxy_read_timeout),
                ("ingress.proxySendTimeout", &ing.proxy_send_timeout),
                ("ingress.proxyConnectTimeout", &ing.proxy_connect_timeout),
            ] {
                if let Err(why) = proxy_timeout(field, v.as_ref()) {
                    self.note(i, why);
                }
            }
        }
        if let Some(ip) = &c.spec.client_ip {
            if let Some(list) = &ip.trusted_proxies {
                let mut set = BTreeSet::new();
                for p in list {
                    match sweety_config::Cidr::parse(p) {
                        Ok(net) => {
                            set.insert(net.to_string());
                        }
                        Err(e) => self.note(i, format!("clientIp.trustedProxies: {e}: left out")),
                    }
                }
                self.trusted.push((i, set));
            }
            let depth = ip.forwarded_for_depth.map(i64::from);
            self.count(i, "clientIp.forwardedForDepth", depth);
        }
    }

    /// The merged settings; fills in the notes of configs whose values do not apply.
    fn config(&mut self) -> Config {
        let mut config = Config::default();
        let (l, ip) = (&mut config.limits, &mut config.client_ip);
        let clamp32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
        for (field, (value, _)) in &self.smallest {
            match (*field, *value) {
                ("limits.maxConnections", Value::Count(n)) => l.max_connections = clamp32(n),
                ("limits.maxRequestsInFlight", Value::Count(n)) => {
                    l.max_requests_in_flight = clamp32(n)
                }
                ("limits.maxRequestBodyBytes", Value::Count(n)) => l.max_request_body_bytes = n,
                ("limits.headerReadTimeout", Value::Time(d)) => l.header_read_timeout = d,
                ("limits.idleTimeout", Value::Time(d)) => l.idle_timeout = d,
                ("limits.bodyIdleTimeout", Value::Time(d)) => l.body_idle_timeout = d,
                ("limits.drainTimeout", Value::Time(d)) => l.drain_timeout = d,
                ("clientIp.forwardedForDepth", Value::Count(n)) => {
                    ip.forwarded_for_depth = clamp32(n)
                }
                _ => unreachable!("{field} is offered with its own kind of value"),
            }
        }
        for (i, field, text) in std::mem::take(&mut self.offered) {
            let w = self.smallest[field].1;
            if w != i {
                let winner = label(self.configs[w]);
                self.note(
                    i,
                    format!(
                        "{field} {text} does not apply: {winner} sets a smaller one (the \
                         smallest wins)"
                    ),
                );
            }
        }
        if let Some(on) = self.access_log {
            config.access_log.enabled = on;
        }
        // Text (the ingress-nginx-like `combined` line) only when every config that names a
        // format says text; JSON otherwise.
        let text = |f: &LogFormat| *f == LogFormat::Text;
        if !self.formats.is_empty() && self.formats.iter().all(|(_, f)| text(f)) {
            config.access_log.format = AccessLogFormat::Combined;
        } else {
            for (i, _) in self.formats.clone().into_iter().filter(|(_, f)| text(f)) {
                self.note(
                    i,
                    "logging.format text does not apply: another config in effect says json \
                     (text only when all say text)"
                        .to_string(),
                );
            }
        }
        match self.trusted.split_first() {
            Some(((_, first), rest)) if rest.iter().all(|(_, set)| set == first) => {
                config.client_ip.trusted_proxies = first.iter().cloned().collect();
            }
            Some(_) => {
                self.trust_conflict = self.trusted.iter().map(|(i, _)| *i).collect();
                let who: Vec<String> = self
                    .trust_conflict
                    .iter()
                    .map(|i| label(self.configs[*i]))
                    .collect();
                for i in self.trust_conflict.clone() {
                    self.note(
                        i,
                        format!(
                            "clientIp.trustedProxies differ between {}: no proxy is trusted \
                             (the peer address is the client) until they agree",
                            who.join(", ")
                        ),
                    );
                }
            }
            None => {}
        }
        config.tracing = self.tracing();
        config
    }

    /// The one `tracing` every config that sets it agrees on (as resolved: endpoint, sampling,
    /// CA and client certificate), when it is valid.
    fn tracing(&mut self) -> Option<sweety_config::Tracing> {
        let resolved: Vec<Result<sweety_config::Tracing, String>> = self
            .tracing
            .iter()
            .map(|(i, t)| {
                let ns = self.configs[*i]
                    .metadata
                    .namespace
                    .as_deref()
                    .unwrap_or_default();
                tracing_config(t, ns, self.snapshot)
            })
            .collect();
        let (first, rest) = resolved.split_first()?;
        if !rest.iter().all(|t| t == first) {
            let all: Vec<usize> = self.tracing.iter().map(|(i, _)| *i).collect();
            let who: Vec<String> = all.iter().map(|i| label(self.configs[*i])).collect();
            for i in all {
                self.note(
                    i,
                    format!(
                        "tracing differs between {}: tracing is off until they agree",
                        who.join(", ")
                    ),
                );
            }
            return None;
        }
        match first {
            Ok(t) => Some(t.clone()),
            Err(e) => {
                for i in self.tracing.iter().map(|(i, _)| *i).collect::<Vec<_>>() {
                    self.note(i, format!("tracing: {e}: tracing is off"));
                }
                None
            }
        }
    }
}

/// The dataplane's `tracing` for a SweetyProxyConfig's in namespace `ns` (its CA ConfigMap and
/// client certificate Secret read from `snapshot`), validated as the dataplane will.
fn tracing_config(
    t: &sweety_crds::proxy_config::TracingSpec,
    ns: &str,
    snapshot: Option<&Snapshot>,
) -> Result<sweety_config::Tracing, String> {
    let (num, den) = t
        .sampling_fraction
        .as_ref()
        .map_or((1, 100), |f| (f.numerator, f.denominator.unwrap_or(100)));
    if num < 0 || den <= 0 || num > den {
        return Err(format!(
            "samplingFraction {num}/{den} is not between 0 and 1"
        ));
    }
    let mut out = sweety_config::Tracing::to(t.otlp_endpoint.clone());
    out.sampling_ratio = f64::from(num) / f64::from(den);
    if let Some(p) = t.parent_based {
        out.parent_based = p;
    }
    if let Some(name) = &t.service_name {
        out.service_name = name.clone();
    }
    if t.otlp_protocol == Some(sweety_crds::proxy_config::OtlpProtocol::Grpc) {
        out.otlp_protocol = sweety_config::OtlpProtocol::Grpc;
    }
    if let Some(r) = &t.ca_certificate_ref {
        let pem = match snapshot.and_then(|s| s.config_map_ca(ns, &r.name)) {
            Some(Some(pem)) => pem,
            Some(None) => {
                return Err(format!(
                    "caCertificateRef: ConfigMap {ns}/{} has no {CA_KEY}",
                    r.name
                ))
            }
            None => {
                return Err(format!(
                    "caCertificateRef: ConfigMap {ns}/{} not found",
                    r.name
                ))
            }
        };
        out.otlp_ca = Some(PemSource::Pem(pem.to_owned()));
    }
    if let Some(r) = &t.client_certificate_ref {
        let secret = snapshot
            .into_iter()
            .flat_map(|s| &s.secrets)
            .find(|s| {
                s.metadata.namespace.as_deref() == Some(ns)
                    && s.metadata.name.as_deref() == Some(r.name.as_str())
            })
            .ok_or_else(|| format!("clientCertificateRef: Secret {ns}/{} not found", r.name))?;
        let get = |key: &str| {
            secret
                .data
                .as_ref()
                .and_then(|d| d.get(key))
                .and_then(|v| String::from_utf8(v.0.clone()).ok())
                .ok_or_else(|| format!("clientCertificateRef: Secret {ns}/{} has no {key}", r.name))
        };
        out.otlp_client_cert = Some(PemSource::Pem(get("tls.crt")?));
        out.otlp_client_key = Some(PemSource::Pem(get("tls.key")?));
    }
    let check = Config {
        tracing: Some(out.clone()),
        ..Config::default()
    };
    match check.validate() {
        Ok(()) => Ok(out),
        Err(errors) => Err(errors
            .0
            .iter()
            .map(|e| format!("{} {}", e.path, e.message))
            .collect::<Vec<_>>()
            .join("; ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::snapshot::Snapshot;
    use sweety_config::Limits;

    fn snapshot(yaml: &str) -> Snapshot {
        Snapshot::from_yaml(yaml).expect("valid test snapshot").0
    }

    const CLASSES: &str = r#"
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: a}
spec:
  controllerName: sweety.dev/gateway-controller
  parametersRef: {group: sweety.dev, kind: SweetyProxyConfig, namespace: sweety, name: a}
---
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: theirs}
spec:
  controllerName: example.com/other
  parametersRef: {group: sweety.dev, kind: SweetyProxyConfig, namespace: sweety, name: theirs}
---
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sweety}
spec:
  controller: sweety.dev/ingress-controller
  parameters: {apiGroup: sweety.dev, kind: SweetyProxyConfig, scope: Namespace, namespace: sweety, name: ing}
"#;

    fn spc(name: &str, spec: &str) -> String {
        format!(
            "---\napiVersion: sweety.dev/v1alpha1\nkind: SweetyProxyConfig\n\
             metadata: {{name: {name}, namespace: sweety, generation: 2}}\nspec: {spec}\n"
        )
    }

    fn condition(statuses: &[(ObjectKey, ObjectStatus)], kind: &str, name: &str) -> Condition {
        let (_, s) = statuses
            .iter()
            .find(|(k, _)| k.kind == kind && k.name == name)
            .unwrap_or_else(|| panic!("no status for {kind} {name}: {statuses:?}"));
        match s {
            ObjectStatus::Conditions(c) => c[0].clone(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_config_keeps_the_dataplane_defaults() {
        let (config, statuses) = settings(&snapshot(""), &Params::default());
        assert_eq!(config, Config::default());
        assert!(statuses.is_empty());
    }

    #[test]
    fn the_smallest_limit_of_the_configs_in_effect_applies_and_the_others_say_so() {
        let s = snapshot(&format!(
            "{CLASSES}{}{}{}",
            spc(
                "a",
                "{limits: {maxRequestBodyBytes: 1048576, idleTimeout: 2m, drainTimeout: 5s}, \
                 logging: {accessLog: false, format: text}}"
            ),
            spc(
                "ing",
                "{limits: {maxRequestBodyBytes: 8388608, idleTimeout: 30s, headerReadTimeout: 3s}}"
            ),
            // Referenced only by a class of another controller: not in effect.
            spc("theirs", "{limits: {maxConnections: 1}}"),
        ));
        let (config, statuses) = settings(&s, &Params::default());
        let l = &config.limits;
        assert_eq!(l.max_request_body_bytes, 1_048_576);
        assert_eq!(l.idle_timeout, Duration::from_secs(30));
        assert_eq!(l.drain_timeout, Duration::from_secs(5));
        assert_eq!(l.header_read_timeout, Duration::from_secs(3));
        assert_eq!(l.max_connections, Limits::default().max_connections);
        assert!(!config.access_log.enabled);
        // `a` says text, `ing` names no format: text.
        assert_eq!(config.access_log.format, AccessLogFormat::Combined);
        let a = condition(&statuses, KIND, "a");
        assert_eq!((a.status.as_str(), a.observed_generation), ("True", 2));
        assert!(a.message.contains("GatewayClass a"), "{}", a.message);
        assert!(
            a.message
                .contains("limits.idleTimeout 2m does not apply: SweetyProxyConfig sweety/ing"),
            "{}",
            a.message
        );
        let ing = condition(&statuses, KIND, "ing");
        assert!(
            ing.message.contains("IngressClass sweety"),
            "{}",
            ing.message
        );
        assert!(ing
            .message
            .contains("limits.maxRequestBodyBytes 8388608 does not apply"));
        assert!(!statuses.iter().any(|(k, _)| k.name == "theirs"));
    }

    #[test]
    fn trusted_proxies_apply_only_when_every_config_agrees() {
        let agree = snapshot(&format!(
            "{CLASSES}{}{}",
            spc(
                "a",
                "{clientIp: {trustedProxies: [10.0.0.0/8, 192.168.1.7], forwardedForDepth: 3}}"
            ),
            spc(
                "ing",
                "{clientIp: {trustedProxies: [192.168.1.7/32, 10.0.0.0/8]}}"
            ),
        ));
        let (config, statuses) = settings(&agree, &Params::default());
        assert_eq!(
            config.client_ip.trusted_proxies,
            ["10.0.0.0/8", "192.168.1.7/32"]
        );
        assert_eq!(config.client_ip.forwarded_for_depth, 3);
        assert_eq!(condition(&statuses, KIND, "a").status, "True");

        let differ = snapshot(&format!(
            "{CLASSES}{}{}",
            spc(
                "a",
                "{clientIp: {trustedProxies: [10.0.0.0/8]}, logging: {format: text}}"
            ),
            spc(
                "ing",
                "{clientIp: {trustedProxies: [0.0.0.0/0]}, logging: {format: json}}"
            ),
        ));
        let (config, statuses) = settings(&differ, &Params::default());
        assert!(config.client_ip.trusted_proxies.is_empty(), "fails closed");
        assert_eq!(config.access_log.format, AccessLogFormat::Json);
        for name in ["a", "ing"] {
            let c = condition(&statuses, KIND, name);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "Conflicted")
            );
            assert!(c.message.contains("no proxy is trusted"), "{}", c.message);
        }
        let a = condition(&statuses, KIND, "a");
        assert!(
            a.message.contains("logging.format text does not apply"),
            "{}",
            a.message
        );
    }

    #[test]
    fn tracing_applies_only_when_every_config_agrees_and_it_is_valid() {
        let spec = "{tracing: {otlpEndpoint: 'http://collector.obs:4318/v1/traces', \
                    samplingFraction: {numerator: 5, denominator: 1000}, parentBased: false, \
                    serviceName: edge}}";
        let agree = snapshot(&format!("{CLASSES}{}{}", spc("a", spec), spc("ing", spec)));
        let (config, statuses) = settings(&agree, &Params::default());
        let t = config.tracing.expect("tracing on");
        assert_eq!(t.otlp_endpoint, "http://collector.obs:4318/v1/traces");
        assert_eq!(t.sampling_ratio, 0.005);
        assert!(!t.parent_based);
        assert_eq!(t.service_name, "edge");
        assert_eq!(condition(&statuses, KIND, "a").status, "True");

        // Defaults: 1 %, parent-based.
        let one = snapshot(&format!(
            "{CLASSES}{}",
            spc("a", "{tracing: {otlpEndpoint: 'http://c:4318/v1/traces'}}")
        ));
        let t = settings(&one, &Params::default()).0.tracing.expect("on");
        assert_eq!((t.sampling_ratio, t.parent_based), (0.01, true));

        let differ = snapshot(&format!(
            "{CLASSES}{}{}",
            spc("a", spec),
            spc(
                "ing",
                "{tracing: {otlpEndpoint: 'http://elsewhere:4318/v1/traces'}}"
            ),
        ));
        let (config, statuses) = settings(&differ, &Params::default());
        assert_eq!(config.tracing, None, "off on a disagreement");
        for name in ["a", "ing"] {
            let c = condition(&statuses, KIND, name);
            assert!(c.message.contains("tracing differs"), "{}", c.message);
        }

        let invalid = snapshot(&format!(
            "{CLASSES}{}",
            spc(
                "a",
                "{tracing: {otlpEndpoint: 'http://c:4317/v1/traces', otlpProtocol: grpc, \
                 samplingFraction: {numerator: 1}}}"
            ),
        ));
        let (config, statuses) = settings(&invalid, &Params::default());
        assert_eq!(config.tracing, None);
        let c = condition(&statuses, KIND, "a");
        assert!(
            c.message
                .contains("tracing.otlp_endpoint a grpc endpoint is scheme://host[:port]"),
            "{}",
            c.message
        );
    }

    #[test]
    fn tracing_over_grpc_and_tls_reads_its_ca_configmap_and_client_secret() {
        use base64::Engine as _;
        const CERT: &str = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        const KEY: &str = "-----BEGIN PRIVATE KEY-----\nAA==\n-----END PRIVATE KEY-----\n";
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let ca_map = format!(
            "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: otlp-ca, namespace: sweety}}\n\
             data: {{ca.crt: {CERT:?}}}\n"
        );
        let client = format!(
            "---\napiVersion: v1\nkind: Secret\nmetadata: {{name: otlp-client, namespace: sweety}}\n\
             type: kubernetes.io/tls\ndata: {{tls.crt: {}, tls.key: {}}}\n",
            b64(CERT),
            b64(KEY)
        );
        let spec = "{tracing: {otlpEndpoint: 'https://collector.obs:4317', otlpProtocol: grpc, \
                    caCertificateRef: {name: otlp-ca}, clientCertificateRef: {name: otlp-client}}}";
        let s = snapshot(&format!("{CLASSES}{}{ca_map}{client}", spc("a", spec)));
        let (config, statuses) = settings(&s, &Params::default());
        let t = config.tracing.expect("tracing on");
        assert_eq!(t.otlp_endpoint, "https://collector.obs:4317");
        assert_eq!(t.otlp_protocol, sweety_config::OtlpProtocol::Grpc);
        assert_eq!(t.otlp_ca, Some(PemSource::Pem(CERT.into())));
        assert_eq!(t.otlp_client_cert, Some(PemSource::Pem(CERT.into())));
        assert_eq!(t.otlp_client_key, Some(PemSource::Pem(KEY.into())));
        assert_eq!(condition(&statuses, KIND, "a").status, "True");

        // Without the ConfigMap (or the Secret) tracing stays off and the config says why.
        for (objects, why) in [
            (
                client.clone(),
                "caCertificateRef: ConfigMap sweety/otlp-ca not found",
            ),
            (
                ca_map.clone(),
                "clientCertificateRef: Secret sweety/otlp-client not found",
            ),
        ] {
            let s = snapshot(&format!("{CLASSES}{}{objects}", spc("a", spec)));
            let (config, statuses) = settings(&s, &Params::default());
            assert_eq!(config.tracing, None, "{why}");
            let c = condition(&statuses, KIND, "a");
            assert!(c.message.contains(why), "{}", c.message);
        }
        // A CA for a plain http:// endpoint is refused by validation.
        let plain = "{tracing: {otlpEndpoint: 'http://collector.obs:4317', otlpProtocol: grpc, \
                     caCertificateRef: {name: otlp-ca}}}";
        let s = snapshot(&format!("{CLASSES}{}{ca_map}", spc("a", plain)));
        let (config, statuses) = settings(&s, &Params::default());
        assert_eq!(config.tracing, None);
        let c = condition(&statuses, KIND, "a");
        assert!(
            c.message
                .contains("tracing.otlp_ca needs an https:// otlp_endpoint"),
            "{}",
            c.message
        );
    }

    #[test]
    fn invalid_values_are_left_out_and_named() {
        let s = snapshot(&format!(
            "{CLASSES}{}",
            spc(
                "a",
                "{limits: {idleTimeout: soon, maxConnections: -1}, \
                 clientIp: {trustedProxies: [not-an-address, 10.0.0.1, 10.1.2.3/8], forwardedForDepth: 0}}"
            ),
        ));
        let (config, statuses) = settings(&s, &Params::default());
        assert_eq!(config.limits, Limits::default());
        assert_eq!(config.client_ip.trusted_proxies, ["10.0.0.1/32"]);
        assert_eq!(config.client_ip.forwarded_for_depth, 1);
        let a = condition(&statuses, KIND, "a");
        for part in [
            "limits.idleTimeout \"soon\" is not a duration",
            "limits.maxConnections -1 is not a positive number",
            "invalid IP address \"not-an-address\"",
            "\"10.1.2.3/8\" has host bits set",
            "clientIp.forwardedForDepth 0 is not a positive number",
        ] {
            assert!(a.message.contains(part), "{part}: {}", a.message);
        }
    }

    #[test]
    fn ingress_class_parameters_of_another_kind_are_said_to_be_ignored() {
        let s = snapshot(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sweety, generation: 4}
spec:
  controller: sweety.dev/ingress-controller
  parameters: {apiGroup: k8s.example.com, kind: IngressParameters, name: external-lb}
"#,
        );
        let (config, statuses) = settings(&s, &Params::default());
        assert_eq!(config, Config::default());
        let c = condition(&statuses, "IngressClass", "sweety");
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("False", "InvalidParameters")
        );
        assert_eq!(c.observed_generation, 4);
        // Ours, but the SweetyProxyConfig does not exist: said too, nothing applied.
        let missing = snapshot(
            r#"
apiVersion: networking.k8s.io/v1
kind: IngressClass
metadata: {name: sweety}
spec:
  controller: sweety.dev/ingress-controller
  parameters: {apiGroup: sweety.dev, kind: SweetyProxyConfig, scope: Namespace, namespace: sweety, name: gone}
"#,
        );
        let (config, statuses) = settings(&missing, &Params::default());
        assert_eq!(config, Config::default());
        let c = condition(&statuses, "IngressClass", "sweety");
        assert_eq!(c.reason, "InvalidParameters");
        assert!(
            c.message
                .contains("SweetyProxyConfig sweety/gone not found"),
            "{}",
            c.message
        );
    }
}
