//! `drover tls init` and `drover tls issue agent|master NAME` (rcgen): a cluster CA
//! and the certificates it signs. An agent's certificate names
//! `<NAME>.agent.drover`, a master's `master.drover` plus the host names and
//! addresses it is reached at; the master binds an agent's certificate to that one
//! agent id (docs/auth.md). Private keys are written readable by their owner only.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use drover_common::spec::is_valid_name;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};

use drover_os::fs::{write_private, Durability};

/// The CA's certificate file in the TLS directory.
pub const CA_CERT: &str = "ca.pem";
/// The CA's key file in the TLS directory.
pub const CA_KEY: &str = "ca.key";
/// The DNS-name suffix of an agent's identity.
pub const AGENT_NAME_SUFFIX: &str = "agent.drover";
/// The DNS name of a master's identity.
pub const MASTER_NAME: &str = "master.drover";

/// What a certificate is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    Agent,
    Master,
}

/// The CA's parameters: the same every time, so the CA read back from its key signs
/// certificates that chain to the CA certificate written by `init`.
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(DnType::CommonName, "Drover cluster CA");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok(params)
}

/// Creates `dir/ca.pem` and `dir/ca.key` (0600); refuses to overwrite them.
pub fn init_ca(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
    if cert_path.exists() || key_path.exists() {
        bail!(
            "{} already holds a CA ({CA_CERT}, {CA_KEY}); remove them first to make a new one (every certificate it signed stops working)",
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let key = KeyPair::generate()?;
    let cert = ca_params()?.self_signed(&key)?;
    write_private(
        &key_path,
        key.serialize_pem().as_bytes(),
        Durability::Synced,
    )
    .with_context(|| format!("cannot write {}", key_path.display()))?;
    std::fs::write(&cert_path, cert.pem())
        .with_context(|| format!("cannot write {}", cert_path.display()))?;
    Ok((cert_path, key_path))
}

/// The subject alternative names of a certificate of `kind` for `name`, plus
/// `extra` names (host names or IP addresses).
pub fn names(kind: Kind, name: &str, extra: &[String]) -> anyhow::Result<Vec<SanType>> {
    if !is_valid_name(name) {
        bail!(
            "`{name}` is not a name: use 1 to 64 of A-Z a-z 0-9 _ . - (an agent's is its agent id)"
        );
    }
    let mut sans = Vec::new();
    let dns = |text: &str| -> anyhow::Result<SanType> {
        Ok(match text.parse::<std::net::IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(text.to_string().try_into()?),
        })
    };
    match kind {
        Kind::Agent => sans.push(dns(&format!("{name}.{AGENT_NAME_SUFFIX}"))?),
        Kind::Master => {
            sans.push(dns(MASTER_NAME)?);
            sans.push(dns(name)?);
        }
    }
    for e in extra {
        if e.ends_with(AGENT_NAME_SUFFIX) || e == MASTER_NAME {
            bail!("`{e}` is an identity name; give the kind and NAME instead");
        }
        sans.push(dns(e)?);
    }
    Ok(sans)
}

/// Issues a certificate of `kind` for `name` signed by the CA in `dir`, written to
/// `dir/<kind>-<name>.pem` and `.key` (0600).
pub fn issue(
    dir: &Path,
    kind: Kind,
    name: &str,
    extra: &[String],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let sans = names(kind, name, extra)?;
    let ca_key_path = dir.join(CA_KEY);
    let ca_key_pem = std::fs::read_to_string(&ca_key_path).with_context(|| {
        format!(
            "cannot read the CA key {}; create a CA with `drover tls init --dir {}`",
            ca_key_path.display(),
            dir.display()
        )
    })?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).context("the CA key is not a PEM private key")?;
    let ca = ca_params()?.self_signed(&ca_key)?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.subject_alt_names = sans;
    let kind_text = match kind {
        Kind::Agent => "agent",
        Kind::Master => "master",
    };
    params
        .distinguished_name
        .push(DnType::CommonName, format!("{kind_text} {name}"));
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &ca, &ca_key)?;
    let cert_path = dir.join(format!("{kind_text}-{name}.pem"));
    let key_path = dir.join(format!("{kind_text}-{name}.key"));
    write_private(
        &key_path,
        key.serialize_pem().as_bytes(),
        Durability::Synced,
    )
    .with_context(|| format!("cannot write {}", key_path.display()))?;
    std::fs::write(&cert_path, cert.pem())
        .with_context(|| format!("cannot write {}", cert_path.display()))?;
    Ok((cert_path, key_path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_identity_and_refuse_impersonation() {
        let agent = names(Kind::Agent, "a1", &[]).unwrap();
        assert_eq!(agent.len(), 1);
        assert!(format!("{agent:?}").contains("a1.agent.drover"));
        let master = names(Kind::Master, "10.0.0.1", &["m.example".into()]).unwrap();
        assert!(format!("{master:?}").contains("master.drover"));
        assert!(format!("{master:?}").contains("IpAddress"));
        assert!(names(Kind::Agent, "-x", &[]).is_err());
        assert!(names(Kind::Agent, "a1", &["b.agent.drover".into()]).is_err());
    }

    #[test]
    fn a_ca_is_made_once_and_signs_certificates() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        assert!(init_ca(dir.path()).is_err(), "no overwrite");
        let (cert, key) = issue(dir.path(), Kind::Agent, "a1", &[]).unwrap();
        assert!(std::fs::read_to_string(cert)
            .unwrap()
            .contains("BEGIN CERTIFICATE"));
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(key).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
