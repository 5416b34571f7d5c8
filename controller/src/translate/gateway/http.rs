//! HTTPRoute (and converted GRPCRoute) rules into sweety-config routes: matches, filters,
//! weighted backends, timeouts and retry.
//!
//! A rule whose backends all fail to resolve (or that has none and no redirect) answers 500.
//! With a mix of valid and invalid weighted backends the invalid share goes to an empty
//! backend ([`INVALID_BACKEND`]); the dataplane answers 503 for it, not the 500 the spec asks
//! for, because sweety-config cannot weight a fixed reply against backends.

use super::backend::{self, Resolved};
use super::listeners::Problem;
use super::model::{FilterSpec, HeaderModSpec, HttpMatchSpec, HttpRuleSpec, PathModSpec};
use super::policy::Policies;
use crate::translate::Builder;
use sweety_config::{
    Action, Backend, Cors, Duration, Filter, FixedResponse, HeaderMatch, HeaderModifier,
    HeaderValue, MatchKind, Mirror, PathMatch, PathRewrite, ProxyAction, QueryMatch, Redirect,
    RetryPolicy, Route, RouteMatch, Timeouts, UrlRewrite, WeightedBackend,
};

/// The empty backend that takes the share of invalid backendRefs.
pub(super) const INVALID_BACKEND: &str = "sweety/invalid-backend-ref";

/// A translated rule.
pub(super) struct RuleResult {
    pub route: Route,
    /// backendRef (and mirror) problems, for `ResolvedRefs`.
    pub unresolved: Vec<Problem>,
    /// Set when the rule uses something unsupported: it answers 500 instead.
    pub unsupported: Option<String>,
    /// Services the rule sends to (for BackendTLSPolicy status).
    pub services: Vec<(String, String)>,
    /// Even the 500 fallback is invalid (bad matches): the rule is left out.
    pub dropped: bool,
}

fn fixed_500() -> Action {
    Action::Fixed(FixedResponse {
        status: 500,
        body: String::new(),
        content_type: None,
    })
}

/// Parse a Gateway API duration (`1h30m`, `500ms`, `10s`). `0s` means no timeout (None).
pub(super) fn duration(s: &str) -> Result<Option<Duration>, String> {
    let mut total: u64 = 0;
    let mut rest = s;
    if rest.is_empty() {
        return Err(format!("invalid duration {s:?}"));
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("invalid duration {s:?}"))?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (1, 2)
        } else if rest.starts_with('h') {
            (3_600_000, 1)
        } else if rest.starts_with('m') {
            (60_000, 1)
        } else if rest.starts_with('s') {
            (1_000, 1)
        } else {
            return Err(format!("invalid duration {s:?}"));
        };
        rest = &rest[len..];
        total = n
            .checked_mul(unit)
            .and_then(|v| total.checked_add(v))
            .ok_or_else(|| format!("duration {s:?} is too long"))?;
    }
    Ok((total > 0).then(|| Duration::from_millis(total)))
}

fn kind_of(t: Option<&str>) -> MatchKind {
    match t {
        Some("RegularExpression") => MatchKind::Regex,
        _ => MatchKind::Exact,
    }
}

fn convert_match(m: &HttpMatchSpec) -> Result<RouteMatch, String> {
    let path = match &m.path {
        None => None,
        Some(p) => {
            let value = p.value.clone().unwrap_or_else(|| "/".into());
            Some(match p.type_.as_deref().unwrap_or("PathPrefix") {
                "Exact" => PathMatch::Exact(value),
                "PathPrefix" => PathMatch::Prefix(value),
                "RegularExpression" => PathMatch::Regex(value),
                other => return Err(format!("path match type {other} is not supported")),
            })
        }
    };
    Ok(RouteMatch {
        path,
        headers: m
            .headers
            .iter()
            .map(|h| HeaderMatch {
                name: h.name.clone(),
                value: h.value.clone(),
                kind: kind_of(h.type_.as_deref()),
            })
            .collect(),
        query: m
            .query_params
            .iter()
            .map(|q| QueryMatch {
                name: q.name.clone(),
                value: q.value.clone(),
                kind: kind_of(q.type_.as_deref()),
            })
            .collect(),
        method: m.method.clone(),
        cookies: Vec::new(),
    })
}

fn header_mod(h: &HeaderModSpec) -> HeaderModifier {
    let nv = |v: &Vec<super::model::NameValue>| {
        v.iter()
            .map(|x| HeaderValue {
                name: x.name.clone(),
                value: x.value.clone(),
            })
            .collect()
    };
    HeaderModifier {
        set: nv(&h.set),
        add: nv(&h.add),
        remove: h.remove.clone(),
    }
}

fn path_mod(p: &PathModSpec) -> Result<PathRewrite, String> {
    match p.type_.as_str() {
        "ReplaceFullPath" => Ok(PathRewrite::Full(
            p.replace_full_path.clone().unwrap_or_else(|| "/".into()),
        )),
        "ReplacePrefixMatch" => Ok(PathRewrite::Prefix(
            p.replace_prefix_match.clone().unwrap_or_else(|| "/".into()),
        )),
        other => Err(format!("path modifier type {other} is not supported")),
    }
}

/// Context for translating the rules of one route.
pub(super) struct RouteCtx<'p> {
    pub policies: &'p Policies,
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub grpc: bool,
}

impl RouteCtx<'_> {
    fn resolve(
        &self,
        b: &mut Builder<'_>,
        r: &super::model::BackendRefSpec,
        out: &mut RuleResult,
    ) -> Option<String> {
        match backend::resolve(b, self.policies, self.kind, &self.namespace, r, self.grpc) {
            Ok(Resolved { backend, service }) => {
                if !out.services.contains(&service) {
                    out.services.push(service);
                }
                Some(backend)
            }
            Err(p) => {
                // Remember the Service anyway: a BackendTLSPolicy on it reports its status.
                let service = (
                    r.namespace
                        .clone()
                        .unwrap_or_else(|| self.namespace.clone()),
                    r.name.clone(),
                );
                if r.kind.as_deref().unwrap_or("Service") == "Service"
                    && !out.services.contains(&service)
                {
                    out.services.push(service);
                }
                if !out.unresolved.contains(&p) {
                    out.unresolved.push(p);
                }
                None
            }
        }
    }

    /// Translate filters; `per_backend` allows only header modifiers.
    fn filters(
        &self,
        b: &mut Builder<'_>,
        filters: &[FilterSpec],
        per_backend: bool,
        out: &mut RuleResult,
    ) -> Result<Vec<Filter>, String> {
        let mut v = Vec::new();
        for f in filters {
            let t = f.type_.as_str();
            if per_backend && !matches!(t, "RequestHeaderModifier" | "ResponseHeaderModifier") {
                return Err(format!("filter {t} is not supported on a backendRef"));
            }
            let missing = || format!("filter {t} has no {t} settings");
            match t {
                "RequestHeaderModifier" => v.push(Filter::RequestHeaders(header_mod(
                    f.request_header_modifier.as_ref().ok_or_else(missing)?,
                ))),
                "ResponseHeaderModifier" => v.push(Filter::ResponseHeaders(header_mod(
                    f.response_header_modifier.as_ref().ok_or_else(missing)?,
                ))),
                "RequestRedirect" => {
                    let r = f.request_redirect.as_ref().ok_or_else(missing)?;
                    let status = match &r.status_code {
                        None => 302,
                        Some(serde_json::Value::Number(n)) => n.as_u64().unwrap_or(0) as u16,
                        Some(serde_json::Value::String(s)) => s.parse().unwrap_or(0),
                        Some(_) => 0,
                    };
                    v.push(Filter::Redirect(Redirect {
                        scheme: r.scheme.clone(),
                        host: r.hostname.clone(),
                        port: r.port.and_then(|p| u16::try_from(p).ok()),
                        path: r.path.as_ref().map(path_mod).transpose()?,
                        status,
                    }));
                }
                "URLRewrite" => {
                    let r = f.url_rewrite.as_ref().ok_or_else(missing)?;
                    v.push(Filter::Rewrite(UrlRewrite {
                        host: r.hostname.clone(),
                        path: r.path.as_ref().map(path_mod).transpose()?,
                    }));
                }
                "RequestMirror" => {
                    let m = f.request_mirror.as_ref().ok_or_else(missing)?;
                    let percent = match (&m.fraction, m.percent) {
                        (Some(fr), _) => {
                            let d = fr.denominator.unwrap_or(100).max(1);
                            f64::from(fr.numerator) * 100.0 / f64::from(d)
                        }
                        (None, Some(p)) => f64::from(p),
                        (None, None) => 100.0,
                    };
                    // An unresolved mirror is reported and skipped; the rule still serves.
                    if let Some(backend) = self.resolve(b, &m.backend_ref, out) {
                        v.push(Filter::Mirror(Mirror { backend, percent }));
                    }
                }
                "CORS" => {
                    let c = f.cors.as_ref().ok_or_else(missing)?;
                    v.push(Filter::Cors(Cors {
                        allow_origins: c.allow_origins.clone(),
                        allow_methods: c.allow_methods.clone(),
                        allow_headers: c.allow_headers.clone(),
                        expose_headers: c.expose_headers.clone(),
                        allow_credentials: c.allow_credentials.unwrap_or(false),
                        max_age: c.max_age.and_then(|a| u64::try_from(a).ok()),
                    }));
                }
                other => return Err(format!("filter type {other} is not supported")),
            }
        }
        Ok(v)
    }

    /// Translate one rule (index `idx`).
    pub(super) fn rule(&self, b: &mut Builder<'_>, idx: usize, rule: &HttpRuleSpec) -> RuleResult {
        let prefix = if self.grpc { "grpcroute" } else { "httproute" };
        let label = rule.name.clone().unwrap_or_else(|| format!("rule-{idx}"));
        let mut out = RuleResult {
            route: Route {
                name: format!("{prefix}/{}/{}/{label}", self.namespace, self.name),
                matches: Vec::new(),
                filters: Vec::new(),
                action: fixed_500(),
                timeouts: Timeouts::default(),
                retry: None,
                max_request_body_bytes: None,
            },
            unresolved: Vec::new(),
            unsupported: None,
            services: Vec::new(),
            dropped: false,
        };
        if let Err(why) = self.rule_body(b, rule, &mut out) {
            out.unsupported = Some(why);
            out.route.matches = rule
                .matches
                .iter()
                .filter_map(|m| convert_match(m).ok())
                .collect();
            out.route.filters.clear();
            out.route.action = fixed_500();
            out.route.timeouts = Timeouts::default();
            out.route.retry = None;
            out.dropped = check_route(&out.route).is_err();
        }
        out
    }

    fn rule_body(
        &self,
        b: &mut Builder<'_>,
        rule: &HttpRuleSpec,
        out: &mut RuleResult,
    ) -> Result<(), String> {
        out.route.matches = rule
            .matches
            .iter()
            .map(convert_match)
            .collect::<Result<_, _>>()?;
        out.route.filters = self.filters(b, &rule.filters, false, out)?;
        let mut backends = Vec::new();
        let mut invalid_weight: u32 = 0;
        for r in &rule.backend_refs {
            let weight = u32::try_from(r.weight.unwrap_or(1)).unwrap_or(0);
            let filters = self.filters(b, &r.filters, true, out)?;
            match self.resolve(b, r, out) {
                Some(backend) => backends.push(WeightedBackend {
                    backend,
                    weight,
                    filters,
                }),
                None => invalid_weight += weight,
            }
        }
        let valid_weight: u32 = backends.iter().map(|w| w.weight).sum();
        if valid_weight > 0 {
            if invalid_weight > 0 {
                b.backends.insert(Backend::new(INVALID_BACKEND, Vec::new()));
                backends.push(WeightedBackend {
                    backend: INVALID_BACKEND.into(),
                    weight: invalid_weight,
                    filters: Vec::new(),
                });
            }
            out.route.action = Action::Proxy(ProxyAction { backends });
        }
        if let Some(t) = &rule.timeouts {
            if let Some(r) = &t.request {
                out.route.timeouts.request = duration(r)?;
            }
            if let Some(r) = &t.backend_request {
                out.route.timeouts.backend = duration(r)?;
            }
        }
        if let Some(r) = &rule.retry {
            let backoff = match &r.backoff {
                Some(d) => duration(d)?,
                None => None,
            };
            let attempts = u32::try_from(r.attempts.unwrap_or(1)).unwrap_or(0);
            if attempts > 0 {
                out.route.retry = Some(RetryPolicy {
                    attempts,
                    codes: r
                        .codes
                        .iter()
                        .filter_map(|c| u16::try_from(*c).ok())
                        .collect(),
                    backoff,
                    budget: None,
                });
            }
        }
        // The dataplane's own checks (regexes, header names, prefix rewrites…): a rule that
        // would make the config invalid answers 500 instead. Unknown backends are expected here
        // (they are only registered in the whole config).
        check_route(&out.route)
    }
}

/// Validate one route in isolation with sweety-config's structural checks.
pub(super) fn check_route(route: &Route) -> Result<(), String> {
    let mut cfg = sweety_config::Config::default();
    cfg.virtual_hosts.push(sweety_config::VirtualHost {
        name: "check".into(),
        hostnames: Vec::new(),
        listeners: Vec::new(),
        routes: vec![route.clone()],
    });
    match cfg.validate_structure() {
        Ok(()) => Ok(()),
        Err(errors) => {
            let real: Vec<String> = errors
                .0
                .iter()
                .map(|e| e.to_string())
                // Backends and user sets are the config's, checked with it.
                .filter(|e| !e.contains("unknown backend") && !e.contains("unknown user set"))
                .collect();
            if real.is_empty() {
                Ok(())
            } else {
                Err(real.join("; "))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration("10s").unwrap(), Some(Duration::from_secs(10)));
        assert_eq!(duration("1h30m").unwrap(), Some(Duration::from_secs(5400)));
        assert_eq!(duration("250ms").unwrap(), Some(Duration::from_millis(250)));
        assert_eq!(duration("0s").unwrap(), None);
        assert!(duration("10x").is_err());
        assert!(duration("").is_err());
    }
}
