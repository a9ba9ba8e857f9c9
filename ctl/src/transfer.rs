//! `export` and `import` over the streamed RPCs (`ExportStream`,
//! `ImportStream`), so a state of any size fits the servers' default
//! message size limits; a server without them gets the one-message Export
//! and Import.

use snowkeep_proto::v1 as pb;
use tonic::Code;

use crate::conn::Admin;

/// The bytes of each ImportStream message: under the smallest
/// `--max-recv-message-size` a server accepts (1 KiB) with its framing.
pub const IMPORT_CHUNK: usize = 1000;

/// The whole state document of the server answering.
///
/// # Errors
/// The call fails, or the document is not UTF-8.
pub async fn export(admin: &mut Admin) -> anyhow::Result<String> {
    let mut stream = match admin.export_stream(pb::ExportStreamRequest {}).await {
        Ok(r) => r.into_inner(),
        Err(s) if s.code() == Code::Unimplemented => {
            return Ok(admin
                .export(pb::ExportRequest {})
                .await?
                .into_inner()
                .document);
        }
        Err(s) => return Err(s.into()),
    };
    let mut bytes = Vec::new();
    while let Some(piece) = stream.message().await? {
        bytes.extend_from_slice(&piece.chunk);
    }
    Ok(String::from_utf8(bytes)?)
}

/// The ImportStream messages of `document`: the options in the first, then
/// the document in pieces of [`IMPORT_CHUNK`] bytes.
fn pieces(document: &str, replace: bool, lead_ms: u64) -> Vec<pb::ImportStreamRequest> {
    let mut out: Vec<pb::ImportStreamRequest> = document
        .as_bytes()
        .chunks(IMPORT_CHUNK)
        .map(|c| pb::ImportStreamRequest {
            chunk: c.to_vec(),
            ..Default::default()
        })
        .collect();
    if out.is_empty() {
        out.push(pb::ImportStreamRequest::default());
    }
    out[0].replace = replace;
    out[0].lead_ms = lead_ms;
    out
}

/// Imports `document` into the server answering.
///
/// # Errors
/// The server refuses the document or cannot be reached.
pub async fn import(
    admin: &mut Admin,
    document: String,
    replace: bool,
    lead_ms: u64,
) -> anyhow::Result<pb::ImportResponse> {
    let stream = tonic::codegen::tokio_stream::iter(pieces(&document, replace, lead_ms));
    match admin.import_stream(stream).await {
        Ok(r) => Ok(r.into_inner().imported.unwrap_or_default()),
        Err(s) if s.code() == Code::Unimplemented => Ok(admin
            .import(pb::ImportRequest {
                document,
                replace,
                lead_ms,
            })
            .await?
            .into_inner()),
        Err(s) => Err(s.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_options_ride_the_first_piece_and_the_pieces_are_the_document() {
        let doc = "x".repeat(2500);
        let p = pieces(&doc, true, 7);
        assert_eq!(p.len(), 3);
        assert_eq!(
            (p[0].replace, p[0].lead_ms, p[0].chunk.len()),
            (true, 7, 1000)
        );
        assert_eq!(
            (p[2].replace, p[2].lead_ms, p[2].chunk.len()),
            (false, 0, 500)
        );
        let joined: Vec<u8> = p.iter().flat_map(|m| m.chunk.clone()).collect();
        assert_eq!(joined, doc.into_bytes());
        assert_eq!(pieces("", false, 3).len(), 1);
    }
}
