//! The checks an import runs on a state document before it writes anything
//! (see [`super`]): a fence a layout can stamp, API keys whose etcd
//! key is the key id the authentication layer accepts, and a lead that
//! keeps every restored fence within the layout.

use snowkeep_client::{Layout, Millis};

use super::{ImportError, NamespaceExport, RawKey};
use crate::keys;
use snowkeep_core::api_key::KeyRecord;
use snowkeep_core::api_key::{is_valid_id, MAX_ID_LEN};

/// INVALID for a fence above the layout's last timestamp: a machine id
/// fenced there could never be claimed again (its successor waits for a
/// clock that never gets there).
pub(super) fn check_fences(ns: &NamespaceExport, layout: &Layout) -> Result<(), ImportError> {
    let max = layout.max_timestamp().get();
    match ns.fences.iter().find(|f| f.fence_ms > max) {
        Some(f) => Err(ImportError::Invalid(format!(
            "namespace {:?}: the fence of machine id {} is {} ms, above the last timestamp of layout {} ({max} ms): a machine id fenced there could never be used again; fix or re-export the document",
            ns.name, f.machine_id, f.fence_ms, layout
        ))),
        None => Ok(()),
    }
}

/// INVALID unless `k` is a key record stored under its own, valid key id:
/// `/snowkeep/v1/apikeys/<id>`, with the id 1 to 64 characters of
/// `A-Z a-z 0-9 _ -` (so a key can never name another place in etcd), and a
/// value the authentication layer reads as that id's record.
pub(super) fn check_api_key(k: &RawKey) -> Result<(), ImportError> {
    let id = k.key.strip_prefix(keys::API_KEYS_ROOT).unwrap_or_default();
    if !k.key.starts_with(keys::API_KEYS_ROOT) || !is_valid_id(id) {
        return Err(ImportError::Invalid(format!(
            "api key {:?} is not {}<id> with a key id of 1 to {MAX_ID_LEN} characters of A-Z a-z 0-9 _ -; nothing was imported",
            k.key,
            keys::API_KEYS_ROOT
        )));
    }
    match KeyRecord::from_json(k.value.as_bytes()) {
        Ok(record) if record.id == id => Ok(()),
        Ok(record) => Err(ImportError::Invalid(format!(
            "api key {:?} holds the record of key id {:?}",
            k.key, record.id
        ))),
        Err(e) => Err(ImportError::Invalid(format!(
            "api key {:?} is not a key record: {e}",
            k.key
        ))),
    }
}

/// INVALID when `now + lead_ms` (the least fence the import writes) is
/// beyond the layout's last timestamp: every machine id would be fenced for
/// good.
pub(super) fn check_lead(
    name: &str,
    layout: &Layout,
    now: Millis,
    lead_ms: u64,
) -> Result<(), ImportError> {
    let max = layout.max_timestamp().get();
    if now.get().saturating_add(lead_ms) > max {
        return Err(ImportError::Invalid(format!(
            "namespace {name:?}: a lead of {lead_ms} ms puts every fence past the last timestamp of layout {layout} ({max} ms, {} ms from now): pass a shorter lead",
            max.saturating_sub(now.get())
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::FenceExport;

    fn ns(fence_ms: u64) -> NamespaceExport {
        NamespaceExport {
            name: "orders".into(),
            record: String::new(),
            layout: String::new(),
            fences: vec![FenceExport {
                machine_id: 7,
                fence_ms,
            }],
            fence_count_root: None,
            fence_count_blocks: Vec::new(),
            last_holders: Vec::new(),
            requesters: 0,
        }
    }

    fn message(r: Result<(), ImportError>) -> String {
        match r {
            Err(ImportError::Invalid(m)) => m,
            other => panic!("not invalid: {other:?}"),
        }
    }

    #[test]
    fn a_fence_past_the_layouts_last_timestamp_is_invalid() {
        let layout = Layout::default();
        let max = layout.max_timestamp().get();
        assert_eq!(max, (1 << 41) - 1);
        assert!(check_fences(&ns(max), &layout).is_ok());
        assert_eq!(
            message(check_fences(&ns(1 << 63), &layout)),
            "namespace \"orders\": the fence of machine id 7 is 9223372036854775808 ms, above the last timestamp of layout 41/12/10@1767225600000 (2199023255551 ms): a machine id fenced there could never be used again; fix or re-export the document"
        );
    }

    #[test]
    fn an_api_key_must_sit_under_its_own_valid_id() {
        let record = |id: &str| {
            format!(
                r#"{{"id":"{id}","description":"","permissions":["ids"],"secret_sha256":"{}"}}"#,
                "0".repeat(64)
            )
        };
        let key = |key: &str, value: String| RawKey {
            key: key.into(),
            value,
        };
        assert!(check_api_key(&key("/snowkeep/v1/apikeys/k1", record("k1"))).is_ok());
        assert_eq!(
            message(check_api_key(&key(
                "/snowkeep/v1/apikeys/../../ns/default/fence/00009",
                record("k1")
            ))),
            "api key \"/snowkeep/v1/apikeys/../../ns/default/fence/00009\" is not /snowkeep/v1/apikeys/<id> with a key id of 1 to 64 characters of A-Z a-z 0-9 _ -; nothing was imported"
        );
        for bad in [
            "/snowkeep/v1/apikeys/",
            "/snowkeep/v1/apikeys/a/b",
            "/other/k1",
        ] {
            assert!(check_api_key(&key(bad, record("k1"))).is_err(), "{bad}");
        }
        assert_eq!(
            message(check_api_key(&key("/snowkeep/v1/apikeys/k1", record("k2")))),
            "api key \"/snowkeep/v1/apikeys/k1\" holds the record of key id \"k2\""
        );
    }

    #[test]
    fn a_lead_past_the_layouts_last_timestamp_is_invalid() {
        let layout = Layout::default();
        let max = layout.max_timestamp().get();
        assert!(check_lead("orders", &layout, Millis(1_000), max - 1_000).is_ok());
        assert_eq!(
            message(check_lead("orders", &layout, Millis(1_000), u64::MAX)),
            format!("namespace \"orders\": a lead of {} ms puts every fence past the last timestamp of layout 41/12/10@1767225600000 (2199023255551 ms, 2199023254551 ms from now): pass a shorter lead", u64::MAX)
        );
    }
}
