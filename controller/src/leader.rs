//! Leader election with a `coordination.k8s.io/v1` Lease in the controller's namespace.
//!
//! Every replica watches, translates and pushes to its own dataplane; only the lease holder
//! writes statuses and per-Gateway Services. A candidate takes the lease when it is free
//! (no holder), released, or expired (`renewTime + leaseDurationSeconds` in the past); every
//! update is a `replace` with the read `resourceVersion`, so two candidates cannot both win.
//! The holder renews every `renew_every`; a renewal that finds another holder, or failures for
//! longer than the lease duration minus one renew period, drop leadership at once.
//!
//! With [`LeaseOptions::owner_service_account`] (the chart's ServiceAccount), the Lease carries
//! an ownerReference to it, set when the Lease is created and added to one that lacks it (a
//! Lease of an older release): `helm uninstall` deletes the ServiceAccount and the garbage
//! collector the Lease.

use crate::Error;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::{Api, Client};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Where the lease lives and how it is timed.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// Namespace of the Lease (the controller's own).
    pub namespace: String,
    /// Name of the Lease object.
    pub name: String,
    /// This candidate's identity (pod name, or hostname + pid).
    pub identity: String,
    /// How long a lease holds without renewal; a candidate may take it after that.
    pub lease_duration: Duration,
    /// How often the holder renews, and how often a candidate tries.
    pub renew_every: Duration,
    /// ServiceAccount (in `namespace`) that owns the Lease, so it goes when the installation
    /// does; `None`: no owner.
    pub owner_service_account: Option<String>,
}

impl LeaseOptions {
    /// Defaults: 15 s lease, renewed every 5 s; identity from `POD_NAME` or hostname + pid.
    pub fn new(namespace: &str, name: &str) -> LeaseOptions {
        LeaseOptions {
            namespace: namespace.into(),
            name: name.into(),
            identity: default_identity(),
            lease_duration: Duration::from_secs(15),
            renew_every: Duration::from_secs(5),
            owner_service_account: None,
        }
    }
}

/// `POD_NAME`, else `hostname-pid`.
pub fn default_identity() -> String {
    if let Ok(p) = std::env::var("POD_NAME") {
        if !p.is_empty() {
            return p;
        }
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "sweety".into());
    format!("{host}-{}", std::process::id())
}

/// The owner reference to the ServiceAccount `name` (the chart's), for what the controller
/// creates in its namespace (the Lease, the shared default certificate) so that it goes with the
/// installation: `Ok(None)` when it cannot be read (the caller goes on without an owner and may
/// retry later); `Err(())` when the ServiceAccount does not exist: the installation is being
/// removed, and an object created now would outlive it.
pub(crate) async fn service_account_owner(
    accounts: &Api<ServiceAccount>,
    name: &str,
) -> Result<Option<Vec<OwnerReference>>, ()> {
    match accounts.get_opt(name).await {
        Ok(Some(sa)) => Ok(sa.metadata.uid.map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "ServiceAccount".into(),
                name: name.into(),
                uid,
                controller: Some(false),
                block_owner_deletion: Some(false),
            }]
        })),
        Ok(None) => {
            tracing::warn!(service_account = name, "owner ServiceAccount not found");
            Err(())
        }
        Err(e) => {
            tracing::warn!(service_account = name, error = %e, "cannot read the owner ServiceAccount");
            Ok(None)
        }
    }
}

/// One candidate for the lease.
#[derive(Clone)]
pub struct LeaderElector {
    api: Api<Lease>,
    accounts: Api<ServiceAccount>,
    options: LeaseOptions,
}

impl LeaderElector {
    /// A candidate that acts through `client` on the lease `options` describe.
    pub fn new(client: Client, options: LeaseOptions) -> LeaderElector {
        LeaderElector {
            api: Api::namespaced(client.clone(), &options.namespace),
            accounts: Api::namespaced(client, &options.namespace),
            options,
        }
    }

    /// The Lease's owner reference to `owner_service_account` ([`service_account_owner`]).
    async fn owner(&self) -> Result<Option<Vec<OwnerReference>>, ()> {
        match self.options.owner_service_account.as_deref() {
            Some(name) => service_account_owner(&self.accounts, name).await,
            None => Ok(None),
        }
    }

    /// This candidate's holder identity in the Lease.
    pub fn identity(&self) -> &str {
        &self.options.identity
    }

    /// Acquire the lease, or renew it when we hold it. `Ok(true)` when we hold it afterwards.
    pub async fn try_acquire_or_renew(&self) -> Result<bool, Error> {
        let now = Timestamp::now();
        let secs = self.options.lease_duration.as_secs().max(1) as i32;
        let current = self
            .api
            .get_opt(&self.options.name)
            .await
            .map_err(Error::Kube)?;
        let Some(mut lease) = current else {
            // No Lease without its owner: it would be left behind by an uninstall in progress.
            let Ok(owner_references) = self.owner().await else {
                return Ok(false);
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.options.name.clone()),
                    namespace: Some(self.options.namespace.clone()),
                    owner_references,
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(self.options.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(Error::Kube(e)),
            };
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let ours = holder == self.options.identity;
        if !ours && !holder.is_empty() {
            let duration = spec.lease_duration_seconds.unwrap_or(secs) as i64;
            let expires = spec
                .renew_time
                .as_ref()
                .map(|t| t.0 + SignedDuration::from_secs(duration));
            if matches!(expires, Some(e) if e > now) {
                return Ok(false);
            }
        }
        if !ours {
            spec.holder_identity = Some(self.options.identity.clone());
            spec.acquire_time = Some(MicroTime(now));
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
        }
        spec.lease_duration_seconds = Some(secs);
        spec.renew_time = Some(MicroTime(now));
        if self.options.owner_service_account.is_some()
            && lease
                .metadata
                .owner_references
                .as_ref()
                .is_none_or(|o| o.is_empty())
        {
            lease.metadata.owner_references = self.owner().await.ok().flatten();
        }
        match self
            .api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Give the lease up if we hold it (clears the holder so another candidate takes over now).
    pub async fn release(&self) -> Result<(), Error> {
        let Some(mut lease) = self
            .api
            .get_opt(&self.options.name)
            .await
            .map_err(Error::Kube)?
        else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.options.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        match self
            .api
            .replace(&self.options.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Run the election loop in the background.
    pub fn spawn(self) -> Leadership {
        let (tx, rx) = watch::channel(false);
        let elector = self.clone();
        let task = tokio::spawn(async move {
            let grace = elector
                .options
                .lease_duration
                .saturating_sub(elector.options.renew_every);
            let mut last_renew: Option<tokio::time::Instant> = None;
            loop {
                match elector.try_acquire_or_renew().await {
                    Ok(true) => {
                        last_renew = Some(tokio::time::Instant::now());
                        tx.send_if_modified(|l| !std::mem::replace(l, true));
                    }
                    Ok(false) => {
                        last_renew = None;
                        tx.send_if_modified(|l| std::mem::replace(l, false));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "lease renewal failed");
                        if last_renew.is_some_and(|t| t.elapsed() >= grace) {
                            last_renew = None;
                            tx.send_if_modified(|l| std::mem::replace(l, false));
                        }
                    }
                }
                tokio::time::sleep(elector.options.renew_every).await;
            }
        });
        Leadership {
            elector: self,
            is_leader: rx,
            task,
        }
    }
}

/// A running election: whether we lead right now, and a way to step down.
pub struct Leadership {
    elector: LeaderElector,
    is_leader: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Changes whenever leadership is gained or lost.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.is_leader.clone()
    }

    /// Whether this replica holds the lease now.
    pub fn is_leader(&self) -> bool {
        *self.is_leader.borrow()
    }

    /// Stop renewing and release the lease.
    pub async fn release(self) -> Result<(), Error> {
        self.task.abort();
        let _ = self.task.await;
        self.elector.release().await
    }
}
