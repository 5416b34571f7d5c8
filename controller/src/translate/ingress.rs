//! Ingress v1 front end: IngressClass selection, rules, default backend and TLS.

use super::Builder;

/// Translate every Ingress of our class (not yet implemented: adds nothing).
pub fn translate(b: &mut Builder<'_>) {
    let _ = b;
}
