//! The shared default certificate: without a configured `--default-certificate` Secret, the
//! controller keeps ONE self-signed certificate for [`DEFAULT_CERTIFICATE_NAME`] in a Secret of
//! its own namespace (`--generated-default-certificate`), so that every replica serves the same
//! certificate to connections without SNI or with a name no certificate covers (a client sees
//! one certificate whichever replica it reaches), and a restart or an upgrade keeps it.
//!
//! - At start ([`SharedDefaultCertificate::at_start`]) every replica, leader or not, reads the
//!   Secret; when it is absent, the replica creates it with a certificate made now
//!   (create-if-absent: when replicas race, the API server's AlreadyExists (409) tells the
//!   losers to read the winner's). Nothing regenerates a usable Secret.
//! - The translation then follows the Secret through the watch, as it follows a configured one
//!   ([`crate::translate::Params::default_certificate_secret`]): what a replacement writes is
//!   served by every replica without a restart.
//! - Content that is unusable ([`check`]: not a `kubernetes.io/tls` Secret, no certificate, no
//!   unencrypted private key the dataplane loads, or a key that is not the certificate's) is
//!   never served:
//!   it is reported (an error log line on every replica that reads it), and only the leader
//!   replaces it ([`SharedDefaultCertificate::keep`]; a write conditional on the
//!   `resourceVersion` it read, so it never overwrites a newer one). Until then a replica that
//!   read it so at start serves a certificate it made then.
//! - The Secret carries an ownerReference to the chart's ServiceAccount (as the leader Lease
//!   does): `helm uninstall` removes it, and it is not created while that ServiceAccount is
//!   missing (an uninstall in progress).
//!
//! Envoy Gateway makes its certificates once, in a Helm hook Job (`certgen`) that creates
//! Secrets in the release namespace if absent; ingress-nginx makes a fake certificate per Pod
//! (what Sweety did before: a different certificate per replica). Here the controller itself
//! creates the Secret: no extra Job or image, and installs rendered with `helm template` get it
//! too.

use crate::leader::service_account_owner;
use crate::translate::ingress::{
    default_certificate_from_secret, SecretError, DEFAULT_CERTIFICATE_NAME,
};
use crate::translate::DefaultCertificate;
use crate::Error;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, Client};
use std::sync::Arc;
use std::time::{Duration, Instant};
use sweety_config::PemSource;
use tokio::sync::watch;

/// The Secret type the certificate is kept in.
const TLS_TYPE: &str = "kubernetes.io/tls";

/// A self-signed certificate and PKCS#8 key for [`DEFAULT_CERTIFICATE_NAME`] (PEM).
pub fn generate() -> Result<DefaultCertificate, Error> {
    let ck = rcgen::generate_simple_self_signed(vec![DEFAULT_CERTIFICATE_NAME.to_string()])
        .map_err(|e| Error::DefaultCertificate(format!("generate a certificate: {e}")))?;
    Ok(DefaultCertificate {
        cert: ck.cert.pem(),
        key: ck.signing_key.serialize_pem(),
    })
}

/// The certificate a Secret holds, when it can be served; else why not: what the translation
/// serves from it ([`default_certificate_from_secret`]: a `kubernetes.io/tls` Secret with PEM
/// blocks the dataplane's validator accepts, a leaf that parses as X.509, and a key the
/// dataplane loads that is the certificate's).
pub fn check(secret: &Secret) -> Result<DefaultCertificate, String> {
    let ns = secret.metadata.namespace.as_deref().unwrap_or_default();
    let name = secret.metadata.name.as_deref().unwrap_or_default();
    let c = default_certificate_from_secret(&[Arc::new(secret.clone())], ns, name).map_err(
        |e| match e {
            SecretError::NotFound => "not found".to_string(),
            SecretError::Invalid(why) => why,
        },
    )?;
    let (PemSource::Pem(cert), PemSource::Pem(key)) = (c.cert, c.key) else {
        return Err("not inline PEM".into());
    };
    Ok(DefaultCertificate { cert, key })
}

/// What [`SharedDefaultCertificate::get_or_create`] found in the Secret.
#[derive(Debug)]
pub enum Found {
    /// A certificate to serve.
    Usable(DefaultCertificate),
    /// Content that must not be served: why, and the object as read (for a conditional
    /// replacement).
    Unusable {
        /// What [`check`] refused.
        reason: String,
        /// The Secret as read.
        secret: Box<Secret>,
    },
}

/// Where the shared default certificate is kept, and how often the leader checks it.
#[derive(Clone, Debug)]
pub struct SharedDefaultCertificate {
    /// The controller's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
    /// ServiceAccount (in `namespace`) set as the Secret's owner, so it goes with the
    /// installation; `None`: no owner.
    pub owner_service_account: Option<String>,
    /// How often the leader reads the Secret back (it also does when it becomes leader):
    /// a deleted one is made again, an unusable one replaced.
    pub check_every: Duration,
}

impl SharedDefaultCertificate {
    /// Kept in `namespace` as `name`, owned by nothing, checked every 30 s.
    pub fn new(namespace: &str, name: &str) -> SharedDefaultCertificate {
        SharedDefaultCertificate {
            namespace: namespace.into(),
            name: name.into(),
            owner_service_account: None,
            check_every: Duration::from_secs(30),
        }
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    fn api(&self, client: &Client) -> Api<Secret> {
        Api::namespaced(client.clone(), &self.namespace)
    }

    /// The Secret to write for `c`, labelled ours and owned by the ServiceAccount.
    async fn secret(&self, client: &Client, c: &DefaultCertificate) -> Result<Secret, Error> {
        let owner_references: Option<Vec<OwnerReference>> = match &self.owner_service_account {
            Some(sa) => service_account_owner(&Api::namespaced(client.clone(), &self.namespace), sa)
                .await
                .map_err(|()| {
                    Error::DefaultCertificate(format!(
                        "not writing {}: its owner, the ServiceAccount {sa}, does not exist (uninstalled?)",
                        self.key()
                    ))
                })?,
            None => None,
        };
        Ok(Secret {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                labels: Some(
                    [(
                        crate::labels::MANAGED_BY_LABEL.to_string(),
                        crate::labels::MANAGED_BY.to_string(),
                    )]
                    .into(),
                ),
                owner_references,
                ..Default::default()
            },
            type_: Some(TLS_TYPE.into()),
            data: Some(
                [
                    (
                        "tls.crt".to_string(),
                        ByteString(c.cert.clone().into_bytes()),
                    ),
                    (
                        "tls.key".to_string(),
                        ByteString(c.key.clone().into_bytes()),
                    ),
                ]
                .into(),
            ),
            ..Default::default()
        })
    }

    /// Read the Secret; when it is absent, create it with a certificate made now, and when
    /// another replica created it first (409), read that one.
    pub async fn get_or_create(&self, client: &Client) -> Result<Found, Error> {
        let api = self.api(client);
        if let Some(s) = api.get_opt(&self.name).await.map_err(Error::Kube)? {
            return Ok(found(s));
        }
        let c = generate()?;
        match api
            .create(&PostParams::default(), &self.secret(client, &c).await?)
            .await
        {
            Ok(_) => {
                tracing::info!(secret = %self.key(), "created the shared default certificate");
                Ok(Found::Usable(c))
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                Ok(found(api.get(&self.name).await.map_err(Error::Kube)?))
            }
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// Replace the unusable `old` (as read) with a certificate made now: a `replace`
    /// conditional on its resourceVersion, or, when its type is not `kubernetes.io/tls` (a
    /// Secret's type cannot change), a delete conditional on its uid and resourceVersion, then
    /// a create. When someone else changed it first (409) or deleted it, what is there now.
    pub async fn replace(&self, client: &Client, old: &Secret) -> Result<Found, Error> {
        let api = self.api(client);
        let c = generate()?;
        let mut new = self.secret(client, &c).await?;
        let written = if old.type_.as_deref().is_none_or(|t| t == TLS_TYPE) {
            new.metadata.resource_version = old.metadata.resource_version.clone();
            api.replace(&self.name, &PostParams::default(), &new)
                .await
                .map(drop)
        } else {
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    resource_version: old.metadata.resource_version.clone(),
                    uid: old.metadata.uid.clone(),
                }),
                ..DeleteParams::default()
            };
            match api.delete(&self.name, &dp).await {
                Ok(_) => api.create(&PostParams::default(), &new).await.map(drop),
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    api.create(&PostParams::default(), &new).await.map(drop)
                }
                Err(e) => Err(e),
            }
        };
        match written {
            Ok(()) => {
                tracing::warn!(secret = %self.key(), "replaced the unusable shared default certificate with a new one");
                Ok(Found::Usable(c))
            }
            Err(kube::Error::Api(e)) if e.code == 409 || e.code == 404 => {
                self.get_or_create(client).await
            }
            Err(e) => Err(Error::Kube(e)),
        }
    }

    /// The certificate to serve from the start: the Secret's ([`get_or_create`], retried for
    /// up to a minute while the API server cannot be reached). Unusable content is reported
    /// and not served: a certificate made now stands in until the leader replaces it (the
    /// translation then follows the Secret).
    ///
    /// [`get_or_create`]: SharedDefaultCertificate::get_or_create
    pub async fn at_start(&self, client: &Client) -> Result<DefaultCertificate, Error> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut wait = Duration::from_millis(250);
        loop {
            match self.get_or_create(client).await {
                Ok(Found::Usable(c)) => return Ok(c),
                Ok(Found::Unusable { reason, .. }) => {
                    tracing::error!(secret = %self.key(), %reason,
                        "the shared default certificate Secret is unusable: not served; the leader replaces it (a certificate made now is served until then)");
                    return generate();
                }
                Err(e) if Instant::now() < deadline => {
                    tracing::warn!(secret = %self.key(), error = %e, "reading the shared default certificate; retrying");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// While this replica leads (and when it becomes leader), every [`check_every`]: make the
    /// Secret again when it was deleted, replace it when its content is unusable. Runs until
    /// dropped; failures are logged and retried on the next round.
    ///
    /// [`check_every`]: SharedDefaultCertificate::check_every
    pub async fn keep(self, client: Client, mut is_leader: watch::Receiver<bool>) {
        let mut leader_open = true;
        loop {
            if *is_leader.borrow_and_update() {
                let outcome = match self.get_or_create(&client).await {
                    Ok(Found::Unusable { reason, secret }) => {
                        tracing::error!(secret = %self.key(), %reason,
                            "the shared default certificate Secret is unusable: not served; replacing it");
                        self.replace(&client, &secret).await.map(drop)
                    }
                    other => other.map(drop),
                };
                if let Err(e) = outcome {
                    tracing::warn!(secret = %self.key(), error = %e, "keeping the shared default certificate");
                }
            }
            let tick = tokio::time::sleep(self.check_every);
            tokio::select! {
                changed = is_leader.changed(), if leader_open => leader_open = changed.is_ok(),
                _ = tick => {}
            }
        }
    }
}

/// [`check`] of a Secret as read.
fn found(s: Secret) -> Found {
    match check(&s) {
        Ok(c) => Found::Usable(c),
        Err(reason) => Found::Unusable {
            reason,
            secret: Box::new(s),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::CertificateDer;

    /// A P-256 certificate for the reserved name with its key in SEC1 (`EC PRIVATE KEY`), as
    /// `openssl ec` writes it (and cert-manager for ECDSA with `encoding: PKCS1`): the dataplane
    /// serves it, so it is usable although it is not PKCS#8.
    const SEC1_CERT: &str = "-----BEGIN CERTIFICATE-----
MIIBvTCCAWKgAwIBAgIUIDx6n9PzIbi+bgoWSbzhnE44ttQwCgYIKoZIzj0EAwIw
ITEfMB0GA1UEAwwWZGVmYXVsdC5zd2VldHkuaW52YWxpZDAgFw0yNjExMjcxNzA0
NDFaGA8yMTI2MTEwMzE3MDQ0MVowITEfMB0GA1UEAwwWZGVmYXVsdC5zd2VldHku
aW52YWxpZDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABEsIS8dndaRTWlPsHqS5
mUgck2SH0x4NtFHd7iygr0B+F/QhgoT7KThIzgvgudOv9fhowRKhk+zFmWzynvYQ
4L2jdjB0MB0GA1UdDgQWBBSVOyG3SZcYeV5Kc45246soYd4ZbDAfBgNVHSMEGDAW
gBSVOyG3SZcYeV5Kc45246soYd4ZbDAPBgNVHRMBAf8EBTADAQH/MCEGA1UdEQQa
MBiCFmRlZmF1bHQuc3dlZXR5LmludmFsaWQwCgYIKoZIzj0EAwIDSQAwRgIhAIBB
oeBYjHOrwqRgxhrn+RaBE33MO+o8/2q1QeD6cocwAiEAs2kwzDtOY2wNTrWWaYio
a2daGXySC75acLbrshbN7GI=
-----END CERTIFICATE-----
";
    const SEC1_KEY: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEINpldWhEFmx4M0wqTISbsQIo0Nq90oVXW0UG8mp3zZw/oAoGCCqGSM49
AwEHoUQDQgAESwhLx2d1pFNaU+wepLmZSByTZIfTHg20Ud3uLKCvQH4X9CGChPsp
OEjOC+C506/1+GjBEqGT7MWZbPKe9hDgvQ==
-----END EC PRIVATE KEY-----
";

    fn secret(type_: Option<&str>, cert: &str, key: &str) -> Secret {
        Secret {
            metadata: ObjectMeta {
                name: Some("sweety-default-certificate".into()),
                namespace: Some("sweety".into()),
                ..Default::default()
            },
            type_: type_.map(str::to_string),
            data: Some(
                [
                    ("tls.crt".to_string(), ByteString(cert.as_bytes().to_vec())),
                    ("tls.key".to_string(), ByteString(key.as_bytes().to_vec())),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn a_generated_certificate_is_usable_and_for_the_reserved_name_only() {
        let c = generate().unwrap();
        assert_eq!(check(&secret(Some(TLS_TYPE), &c.cert, &c.key)).unwrap(), c);
        let der = CertificateDer::from_pem_slice(c.cert.as_bytes()).unwrap();
        let ee = webpki::EndEntityCert::try_from(&der).unwrap();
        let names: Vec<_> = ee.valid_dns_names().collect();
        assert_eq!(names, [DEFAULT_CERTIFICATE_NAME]);
        // Two generations differ: sharing comes from the Secret, not from determinism.
        assert_ne!(generate().unwrap().cert, c.cert);
    }

    #[test]
    fn unusable_content_is_refused_with_the_reason() {
        let a = generate().unwrap();
        let b = generate().unwrap();
        let why = |s: Secret| check(&s).unwrap_err();
        // Another certificate's key.
        assert!(
            why(secret(Some(TLS_TYPE), &a.cert, &b.key)).contains("not the key of the certificate")
        );
        // Not a TLS Secret.
        assert!(why(secret(Some("Opaque"), &a.cert, &a.key)).contains("kubernetes.io/tls"));
        // No certificate, or a PEM block that is no X.509 certificate.
        assert!(why(secret(Some(TLS_TYPE), "", &a.key)).contains("tls.crt"));
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert!(why(secret(Some(TLS_TYPE), garbage, &a.key)).contains("tls.crt"));
        // No key, an encrypted one, or a key that is no key.
        assert!(why(secret(Some(TLS_TYPE), &a.cert, "")).contains("tls.key"));
        let encrypted =
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n";
        assert!(why(secret(Some(TLS_TYPE), &a.cert, encrypted)).contains("tls.key"));
        let bogus = "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert!(why(secret(Some(TLS_TYPE), &a.cert, bogus)).contains("tls.key"));
        // No data at all.
        let mut empty = secret(Some(TLS_TYPE), "", "");
        empty.data = None;
        assert!(why(empty).contains("tls.crt"));
        // A Secret without a type (as created by hand) is fine when its content is.
        assert!(check(&secret(None, &a.cert, &a.key)).is_ok());
    }

    #[test]
    fn a_key_the_dataplane_serves_is_usable_in_any_of_its_encodings() {
        // SEC1 is no PKCS#8, but the dataplane loads it: not unusable (the leader would
        // otherwise replace a certificate someone put there on purpose, every round).
        let c = check(&secret(Some(TLS_TYPE), SEC1_CERT, SEC1_KEY)).unwrap();
        assert_eq!((c.cert.as_str(), c.key.as_str()), (SEC1_CERT, SEC1_KEY));
        // The same certificate with another key of the same kind is not.
        let other = generate().unwrap();
        assert!(check(&secret(Some(TLS_TYPE), SEC1_CERT, &other.key))
            .unwrap_err()
            .contains("not the key of the certificate"));
    }

    #[test]
    fn found_keeps_the_object_of_unusable_content() {
        let a = generate().unwrap();
        let mut s = secret(Some(TLS_TYPE), &a.cert, "");
        s.metadata.resource_version = Some("42".into());
        match found(s) {
            Found::Unusable { reason, secret } => {
                assert!(reason.contains("tls.key"), "{reason}");
                assert_eq!(secret.metadata.resource_version.as_deref(), Some("42"));
            }
            Found::Usable(_) => panic!("unusable content was found usable"),
        }
        assert!(matches!(
            found(secret(Some(TLS_TYPE), &a.cert, &a.key)),
            Found::Usable(c) if c == a
        ));
    }
}
