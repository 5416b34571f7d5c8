//! SweetySite front end: one object describing a whole site.

use super::Builder;

/// Translate every SweetySite (not yet implemented: adds nothing).
pub fn translate(b: &mut Builder<'_>) {
    let _ = b;
}
