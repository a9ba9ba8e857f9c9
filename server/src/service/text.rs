//! The text form of ids on the wire (`snowkeep.v1.IdFormat`): which form a
//! request asks for, the texts that go beside the numbers, and the id a
//! `DecodeIdRequest` names as a number or as text. The codec itself is
//! `snowkeep_client::text_id`, shared with the Rust client and snowkeepctl.

use snowkeep_client::{text_id, Layout};
use snowkeep_proto::v1 as pb;

use super::status::ApiError;

/// The forms a request's `format` field asks for: `Some(total_bits)` when
/// texts of a `total_bits`-bit layout go beside the numbers, `None` for
/// numbers only.
///
/// # Errors
/// [`ApiError::InvalidIdFormat`] for a value `IdFormat` does not have.
pub fn texts_wanted(format: i32, layout: &Layout) -> Result<Option<u8>, ApiError> {
    match pb::IdFormat::try_from(format) {
        Ok(pb::IdFormat::Unspecified) => Ok(None),
        Ok(pb::IdFormat::CrockfordBase32) => Ok(Some(layout.total_bits())),
        Err(_) => Err(ApiError::InvalidIdFormat { got: format }),
    }
}

/// The texts of `ids` when `total_bits` is set (see [`texts_wanted`]),
/// otherwise none: the `texts` field parallel to `ids`.
pub fn texts_of(ids: &[u64], total_bits: Option<u8>) -> Vec<String> {
    match total_bits {
        Some(bits) => ids.iter().map(|&id| text_id::encode(id, bits)).collect(),
        None => Vec::new(),
    }
}

/// The id a `DecodeId` request names: `text` decoded under `layout` when it
/// is set, otherwise `id` (0 included, as before `text` existed).
///
/// # Errors
/// [`ApiError::IdAndText`] when both a nonzero `id` and a `text` are set;
/// [`ApiError::InvalidIdText`] when the text is not an id of the layout.
pub fn requested_id(req: &pb::DecodeIdRequest, layout: &Layout) -> Result<u64, ApiError> {
    match (req.id, req.text.as_str()) {
        (id, "") => Ok(id),
        (0, text) => text_id::decode(text, layout.total_bits()).map_err(ApiError::InvalidIdText),
        (id, text) => Err(ApiError::IdAndText {
            id,
            text: text.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    fn status(e: ApiError) -> Status {
        e.into()
    }

    #[test]
    fn a_format_asks_for_texts_of_the_layouts_width() {
        let layout = Layout::default();
        assert_eq!(texts_wanted(0, &layout).unwrap(), None);
        assert_eq!(texts_wanted(1, &layout).unwrap(), Some(63));
        let s = status(texts_wanted(7, &layout).unwrap_err());
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(
            s.message(),
            "format 7 is not an IdFormat this server knows: use 0 (ID_FORMAT_UNSPECIFIED, numbers \
             only) or 1 (ID_FORMAT_CROCKFORD_BASE32, numbers and texts)"
        );
        assert_eq!(
            texts_of(&[0, 4_194_309_125], Some(63)),
            vec!["0000000000000", "0000003X00505"]
        );
        assert!(texts_of(&[1, 2], None).is_empty());
    }

    #[test]
    fn decode_id_takes_the_number_or_the_text_never_both() {
        let layout = Layout::default();
        let req = |id: u64, text: &str| pb::DecodeIdRequest {
            id,
            text: text.to_owned(),
        };
        assert_eq!(requested_id(&req(0, ""), &layout).unwrap(), 0);
        assert_eq!(requested_id(&req(42, ""), &layout).unwrap(), 42);
        assert_eq!(
            requested_id(&req(0, "0000003x00505"), &layout).unwrap(),
            4_194_309_125
        );
        let both = status(requested_id(&req(42, "000000000001A"), &layout).unwrap_err());
        assert_eq!(both.code(), Code::InvalidArgument);
        assert_eq!(
            both.message(),
            "send the id either as a number (id) or as text (text), not both: got id 42 and \
             text \"000000000001A\""
        );
        let bad = status(requested_id(&req(0, "0000003U00505"), &layout).unwrap_err());
        assert_eq!(bad.code(), Code::InvalidArgument);
        assert_eq!(
            bad.message(),
            "id text \"0000003U00505\" has 'U' at position 8, which is not a Crockford base32 \
             digit (0-9 and A-Z except U; I and L read as 1, O as 0)"
        );
    }
}
