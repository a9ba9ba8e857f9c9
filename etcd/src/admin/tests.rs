use super::document::repeated;
use super::import::tightened;
use snowkeep_core::api_key::KeyRecord;

fn record(revoked: bool, expires_unix_ms: u64) -> String {
    format!(
        r#"{{"id":"k1","expires_unix_ms":{expires_unix_ms},"revoked":{revoked},"permissions":["ids"],"secret_sha256":"{}"}}"#,
        "ab".repeat(32)
    )
}

fn read(value: &str) -> (bool, u64) {
    let r: KeyRecord = serde_json::from_str(value).unwrap();
    (r.revoked, r.expires_unix_ms)
}

#[test]
fn an_imported_key_is_never_loosened_by_the_document() {
    // Revoked since the export: stays revoked.
    assert_eq!(
        read(&tightened(&record(false, 0), record(true, 0).as_bytes())),
        (true, 0)
    );
    // Expired earlier since the export: keeps the earlier expiry.
    assert_eq!(
        read(&tightened(&record(false, 0), record(false, 5).as_bytes())),
        (false, 5)
    );
    assert_eq!(
        read(&tightened(&record(false, 9), record(false, 5).as_bytes())),
        (false, 5)
    );
    // The document tightens too.
    assert_eq!(
        read(&tightened(&record(true, 3), record(false, 5).as_bytes())),
        (true, 3)
    );
    // An unreadable stored value tightens nothing.
    assert_eq!(tightened(&record(false, 7), b"garbage"), record(false, 7));
}

#[test]
fn a_document_naming_anything_twice_is_invalid() {
    assert!(repeated("x", [1, 2, 3].into_iter()).is_ok());
    let e = repeated("fence of machine id", [4u16, 5, 4].into_iter()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the document names fence of machine id 4 twice: an export names each once; fix or re-export the document"
    );
}
