//! Reading the files the etcd TLS and authentication flags name, once at
//! start, so a server never connects with files it cannot use; each error
//! names the flag and never quotes a key or a password.

use std::path::Path;

use crate::tls::TlsError;

use super::ConfigError;

/// [`ConfigError::EtcdFile`] for `flag`'s file `path`.
fn file_error(flag: &'static str, path: &Path, problem: impl Into<String>) -> ConfigError {
    ConfigError::EtcdFile {
        flag,
        path: path.to_owned(),
        problem: problem.into(),
    }
}

/// Reads `path` for `flag`; an unreadable file names the OS error.
fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes =
        std::fs::read(path).map_err(|e| file_error(flag, path, format!("cannot read it ({e})")))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(file_error(flag, path, "the file is empty"));
    }
    Ok(bytes)
}

/// Reads a PEM file that must hold at least one certificate, and no
/// malformed PEM section.
pub(super) fn read_certificates(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    let bytes = read_file(flag, path)?;
    // The gRPC port's own check of a certificate file, worded for etcd.
    crate::tls::certificates(flag, path, &bytes).map_err(|e| match e {
        TlsError::Malformed { detail, .. } => {
            file_error(flag, path, format!("not a readable PEM file ({detail})"))
        }
        _ => file_error(
            flag,
            path,
            "no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
        ),
    })?;
    Ok(bytes)
}

/// Reads a PEM file that must hold a private key.
pub(super) fn read_private_key(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConfigError> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::PrivateKeyDer;
    let bytes = read_file(flag, path)?;
    // The message never quotes the file: it holds a key.
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|_| {
        file_error(
            flag,
            path,
            "no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
        )
    })?;
    Ok(bytes)
}

/// Reads the etcd password: the file's text without one trailing newline.
pub(super) fn read_password(path: &Path) -> Result<String, ConfigError> {
    const FLAG: &str = "--etcd-password-file (SNOWKEEP_ETCD_PASSWORD_FILE)";
    let bytes = read_file(FLAG, path)?;
    let text = String::from_utf8(bytes)
        .map_err(|_| file_error(FLAG, path, "the password is not UTF-8 text"))?;
    let password = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    Ok(password.to_owned())
}
