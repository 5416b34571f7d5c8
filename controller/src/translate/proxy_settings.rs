//! Dataplane-wide settings from the SweetyProxyConfigs our classes point at.
//!
//! A GatewayClass of ours (`spec.parametersRef`) and an IngressClass we serve
//! (`spec.parameters`, scope `Namespace`) may each name a SweetyProxyConfig. One dataplane
//! serves every class, so its limits, access log and client-address settings are one set:
//!
//! - **limits**: for each field, the smallest value any config in effect sets wins (the most
//!   restrictive; unset fields keep the dataplane defaults of docs/config.md);
//! - **logging.accessLog**: on when any config says on, off only when those that say something
//!   all say off (`logging.format: text` is not implemented yet: the condition says so);
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

use super::ingress::served_classes;
use super::snapshot::Snapshot;
use super::status::{Condition, ObjectKey, ObjectStatus};
use super::Params;
use std::collections::{BTreeMap, BTreeSet};
use sweety_config::{Config, Duration, Limits};
use sweety_crds::SweetyProxyConfig;

const GROUP: &str = "sweety.dev";
const KIND: &str = "SweetyProxyConfig";

/// The settings part of the config (no listeners, virtual hosts or backends) and the statuses
/// of the SweetyProxyConfigs in effect and of IngressClasses with parameters we ignore.
pub fn settings(snapshot: &Snapshot, params: &Params) -> (Config, Vec<(ObjectKey, ObjectStatus)>) {
    let mut statuses = Vec::new();
    // (namespace, name) → who refers to it.
    let mut users: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut classes: Vec<_> = snapshot
        .gateway_classes
        .iter()
        .filter(|c| c.spec.controller_name == params.controller_name)
        .collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    for class in classes {
        let Some(p) = class.spec.parameters_ref.as_ref() else {
            continue;
        };
        // (classes::translate sets the GatewayClass's own condition for a bad reference.)
        if let (GROUP, KIND, Some(ns)) = (p.group.as_str(), p.kind.as_str(), p.namespace.as_deref())
        {
            users
                .entry((ns.to_string(), p.name.clone()))
                .or_default()
                .push(format!(
                    "GatewayClass {}",
                    class.metadata.name.as_deref().unwrap_or_default()
                ));
        }
    }
    for class in served_classes(snapshot, params) {
        let name = class.metadata.name.clone().unwrap_or_default();
        let Some(p) = class.spec.as_ref().and_then(|s| s.parameters.as_ref()) else {
            continue;
        };
        let ours = p.api_group.as_deref() == Some(GROUP) && p.kind == KIND;
        match (ours, p.scope.as_deref(), p.namespace.as_deref()) {
            (true, Some("Namespace"), Some(ns)) => users
                .entry((ns.to_string(), p.name.clone()))
                .or_default()
                .push(format!("IngressClass {name}")),
            _ => statuses.push((
                ObjectKey::new("IngressClass", "", &name),
                ObjectStatus::Conditions(vec![Condition::new(
                    "Accepted",
                    false,
                    "InvalidParameters",
                    format!(
                        "spec.parameters must name a {KIND} of group {GROUP} with scope \
                         Namespace and a namespace; got kind {:?} of group {:?} (scope {:?}): \
                         ignored, the dataplane-wide settings apply",
                        p.kind,
                        p.api_group.as_deref().unwrap_or(""),
                        p.scope.as_deref().unwrap_or("Cluster")
                    ),
                    class.metadata.generation.unwrap_or(0),
                )]),
            )),
        }
    }
    let configs: Vec<(&SweetyProxyConfig, Vec<String>)> = users
        .into_iter()
        .filter_map(|((ns, name), users)| {
            snapshot
                .proxy_configs
                .iter()
                .find(|c| {
                    c.metadata.namespace.as_deref() == Some(ns.as_str())
                        && c.metadata.name.as_deref() == Some(name.as_str())
                })
                .map(|c| (c.as_ref(), users))
        })
        .collect();
    let mut merge = Merge::default();
    for (i, (c, _)) in configs.iter().enumerate() {
        merge.add(i, c);
    }
    let config = merge.config();
    for (i, (c, users)) in configs.iter().enumerate() {
        let notes = merge.notes.get(&i).cloned().unwrap_or_default();
        let conflicted = merge.trust_conflict.contains(&i);
        let mut message = format!("dataplane-wide settings of {}", users.join(", "));
        for n in &notes {
            message.push_str("; ");
            message.push_str(n);
        }
        let key = ObjectKey::new(
            KIND,
            c.metadata.namespace.as_deref().unwrap_or_default(),
            c.metadata.name.as_deref().unwrap_or_default(),
        );
        let condition = if conflicted {
            Condition::new(
                "Accepted",
                false,
                "Conflicted",
                message,
                c.metadata.generation.unwrap_or(0),
            )
        } else {
            Condition::new(
                "Accepted",
                true,
                "Accepted",
                message,
                c.metadata.generation.unwrap_or(0),
            )
        };
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

/// One limit: the smallest value so far and the config it came from.
type Smallest<T> = Option<(T, usize)>;

/// The merge of the configs in effect, in order (see the module docs).
#[derive(Default)]
struct Merge<'a> {
    configs: Vec<&'a SweetyProxyConfig>,
    max_connections: Smallest<u32>,
    max_requests_in_flight: Smallest<u32>,
    max_request_body_bytes: Smallest<u64>,
    header_read_timeout: Smallest<Duration>,
    idle_timeout: Smallest<Duration>,
    body_idle_timeout: Smallest<Duration>,
    drain_timeout: Smallest<Duration>,
    access_log: Option<bool>,
    trusted: Option<BTreeSet<String>>,
    trust_conflict: BTreeSet<usize>,
    /// Configs that set trusted proxies.
    trust_setters: Vec<usize>,
    forwarded_for_depth: Smallest<u32>,
    /// Per config: fields where its value does not apply, and why.
    notes: BTreeMap<usize, Vec<String>>,
    /// (config, field) pairs each limit was set by, to say who lost afterwards.
    set: Vec<(usize, &'static str, String)>,
}

/// `slot` takes `value` when it is smaller (ties keep the earlier config).
fn smaller<T: PartialOrd + Copy>(slot: &mut Smallest<T>, value: T, i: usize) {
    match slot {
        Some((v, _)) if *v <= value => {}
        _ => *slot = Some((value, i)),
    }
}

impl<'a> Merge<'a> {
    fn note(&mut self, i: usize, text: String) {
        self.notes.entry(i).or_default().push(text);
    }

    fn add(&mut self, i: usize, c: &'a SweetyProxyConfig) {
        self.configs.push(c);
        if let Some(l) = &c.spec.limits {
            let count = |v: Option<i64>, field: &'static str, m: &mut Merge<'a>| -> Option<u64> {
                let v = v?;
                match u64::try_from(v) {
                    Ok(n) if n > 0 => {
                        m.set.push((i, field, v.to_string()));
                        Some(n)
                    }
                    _ => {
                        m.note(
                            i,
                            format!("limits.{field} {v} is not a positive number: left out"),
                        );
                        None
                    }
                }
            };
            let clamp32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);
            if let Some(n) = count(l.max_connections, "maxConnections", self) {
                smaller(&mut self.max_connections, clamp32(n), i);
            }
            if let Some(n) = count(l.max_requests_in_flight, "maxRequestsInFlight", self) {
                smaller(&mut self.max_requests_in_flight, clamp32(n), i);
            }
            if let Some(n) = count(l.max_request_body_bytes, "maxRequestBodyBytes", self) {
                smaller(&mut self.max_request_body_bytes, n, i);
            }
            let durations: [(&Option<String>, &'static str); 4] = [
                (&l.header_read_timeout, "headerReadTimeout"),
                (&l.idle_timeout, "idleTimeout"),
                (&l.body_idle_timeout, "bodyIdleTimeout"),
                (&l.drain_timeout, "drainTimeout"),
            ];
            for (v, field) in durations {
                let Some(text) = v else { continue };
                let d = match text.parse::<Duration>() {
                    Ok(d) if !d.is_zero() => d,
                    _ => {
                        self.note(
                            i,
                            format!("limits.{field} {text:?} is not a duration like 30s: left out"),
                        );
                        continue;
                    }
                };
                self.set.push((i, field, text.clone()));
                let slot = match field {
                    "headerReadTimeout" => &mut self.header_read_timeout,
                    "idleTimeout" => &mut self.idle_timeout,
                    "bodyIdleTimeout" => &mut self.body_idle_timeout,
                    _ => &mut self.drain_timeout,
                };
                smaller(slot, d, i);
            }
        }
        if let Some(on) = c.spec.logging.as_ref().and_then(|l| l.access_log) {
            self.access_log = Some(self.access_log.unwrap_or(false) || on);
        }
        if c.spec.logging.as_ref().and_then(|l| l.format)
            == Some(sweety_crds::proxy_config::LogFormat::Text)
        {
            self.note(
                i,
                "logging.format text is not implemented by the dataplane yet: it writes JSON \
                 lines"
                    .to_string(),
            );
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
                self.trust_setters.push(i);
                match &self.trusted {
                    None => self.trusted = Some(set),
                    Some(prev) if *prev == set => {}
                    Some(_) => {
                        self.trust_conflict
                            .extend(self.trust_setters.iter().copied());
                    }
                }
                if !self.trust_conflict.is_empty() {
                    self.trust_conflict.insert(i);
                }
            }
            if let Some(d) = ip.forwarded_for_depth {
                match u32::try_from(d) {
                    Ok(d) if d > 0 => {
                        self.set.push((i, "forwardedForDepth", d.to_string()));
                        smaller(&mut self.forwarded_for_depth, d, i);
                    }
                    _ => self.note(
                        i,
                        format!(
                            "clientIp.forwardedForDepth {d} is not a positive number: left out"
                        ),
                    ),
                }
            }
        }
    }

    /// The merged settings; fills in the notes of configs whose values lost.
    fn config(&mut self) -> Config {
        let mut config = Config::default();
        let l: &mut Limits = &mut config.limits;
        let winners: Vec<(&'static str, Option<usize>)> = vec![
            (
                "maxConnections",
                self.max_connections.map(|(v, i)| {
                    l.max_connections = v;
                    i
                }),
            ),
            (
                "maxRequestsInFlight",
                self.max_requests_in_flight.map(|(v, i)| {
                    l.max_requests_in_flight = v;
                    i
                }),
            ),
            (
                "maxRequestBodyBytes",
                self.max_request_body_bytes.map(|(v, i)| {
                    l.max_request_body_bytes = v;
                    i
                }),
            ),
            (
                "headerReadTimeout",
                self.header_read_timeout.map(|(v, i)| {
                    l.header_read_timeout = v;
                    i
                }),
            ),
            (
                "idleTimeout",
                self.idle_timeout.map(|(v, i)| {
                    l.idle_timeout = v;
                    i
                }),
            ),
            (
                "bodyIdleTimeout",
                self.body_idle_timeout.map(|(v, i)| {
                    l.body_idle_timeout = v;
                    i
                }),
            ),
            (
                "drainTimeout",
                self.drain_timeout.map(|(v, i)| {
                    l.drain_timeout = v;
                    i
                }),
            ),
            (
                "forwardedForDepth",
                self.forwarded_for_depth.map(|(v, i)| {
                    config.client_ip.forwarded_for_depth = v;
                    i
                }),
            ),
        ];
        if let Some(on) = self.access_log {
            config.access_log.enabled = on;
        }
        if self.trust_conflict.is_empty() {
            if let Some(set) = &self.trusted {
                config.client_ip.trusted_proxies = set.iter().cloned().collect();
            }
        } else {
            let who: Vec<String> = self
                .trust_conflict
                .iter()
                .map(|i| label(self.configs[*i]))
                .collect();
            for i in self.trust_conflict.clone() {
                self.note(
                    i,
                    format!(
                        "clientIp.trustedProxies differ between {}: no proxy is trusted (the \
                         peer address is the client) until they agree",
                        who.join(", ")
                    ),
                );
            }
        }
        for (i, field, value) in std::mem::take(&mut self.set) {
            let Some((_, Some(w))) = winners.iter().find(|(f, _)| *f == field) else {
                continue;
            };
            if *w != i {
                let section = if field == "forwardedForDepth" {
                    "clientIp"
                } else {
                    "limits"
                };
                let text = format!(
                    "{section}.{field} {value} does not apply: {} sets a smaller one (the \
                     smallest wins)",
                    label(self.configs[*w])
                );
                self.note(i, text);
            }
        }
        config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::translate::snapshot::Snapshot;

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
                 logging: {accessLog: false}}"
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
            spc("a", "{clientIp: {trustedProxies: [10.0.0.0/8]}}"),
            spc("ing", "{clientIp: {trustedProxies: [0.0.0.0/0]}}"),
        ));
        let (config, statuses) = settings(&differ, &Params::default());
        assert!(config.client_ip.trusted_proxies.is_empty(), "fails closed");
        for name in ["a", "ing"] {
            let c = condition(&statuses, KIND, name);
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", "Conflicted")
            );
            assert!(c.message.contains("no proxy is trusted"), "{}", c.message);
        }
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
    }
}
