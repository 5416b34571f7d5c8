//! Sweety's Kubernetes controller, as a library so tests can drive every part of it.
//!
//! - [`translate`]: the pure function from a snapshot of Kubernetes objects to the dataplane
//!   config plus the status of every object. No I/O, no clock.
//! - [`labels`]: the label and annotation names shared by `translate` and the I/O modules.
//! - [`default_certificate`]: the self-signed default certificate every replica shares.
//! - The runtime parts (watches, the push to the dataplane, the status writer, leader election)
//!   live in their own modules and only move data in and out of `translate`.

pub mod config_items;
pub mod default_certificate;
pub mod error;
pub mod gateway_services;
pub mod health;
pub mod labels;
pub mod leader;
pub mod metrics;
pub mod migrate_report;
pub mod push;
pub mod run;
pub mod static_content;
pub mod status_worker;
pub mod status_writer;
pub mod translate;
pub mod watch;

pub use error::Error;
