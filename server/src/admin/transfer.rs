//! `AdminService.ExportStream` and `ImportStream`: the state document of
//! Export and Import, cut into pieces that fit the server's message size
//! limits, so a backup and its restore work at any size with the default
//! `--max-send-message-size` and `--max-recv-message-size`.

use std::pin::Pin;

use futures_util::Stream;
use snowkeep_proto::v1 as pb;
use tonic::{Request, Response, Status, Streaming};

use super::state::{AdminStore, StateAdmin};
use crate::audit::Who;

/// The largest document ImportStream assembles, bytes. A full default
/// namespace (4,096 fences, each about 85 bytes of document) is under
/// 1 MiB; this leaves room for hundreds of them.
pub const MAX_IMPORT_DOCUMENT: usize = 256 << 20;

/// The largest piece ExportStream sends, bytes: big enough that a large
/// export takes few messages, small enough for any client's receive limit.
const MAX_EXPORT_CHUNK: usize = 64 << 10;

/// What a piece's message adds to its bytes: the field's tag and length.
const CHUNK_FRAMING: usize = 8;

/// The stream of ExportStream.
pub type ExportStream =
    Pin<Box<dyn Stream<Item = Result<pb::ExportStreamResponse, Status>> + Send + 'static>>;

/// The piece size for a server sending messages of at most `max_send` bytes.
pub fn export_chunk(max_send: usize) -> usize {
    max_send
        .saturating_sub(CHUNK_FRAMING)
        .clamp(1, MAX_EXPORT_CHUNK)
}

/// `document` in pieces of at most `chunk` bytes, in order.
fn pieces(document: String, chunk: usize) -> Vec<Result<pb::ExportStreamResponse, Status>> {
    document
        .into_bytes()
        .chunks(chunk.max(1))
        .map(|c| Ok(pb::ExportStreamResponse { chunk: c.to_vec() }))
        .collect()
}

/// Why a streamed document cannot be assembled.
fn too_large(len: usize) -> Status {
    Status::resource_exhausted(format!(
        "the document sent to ImportStream is over {len} bytes, more than the {MAX_IMPORT_DOCUMENT} bytes an import takes: import it in parts (a document per namespace)"
    ))
}

/// Reads every piece of an ImportStream call into one request: the options
/// of the first message, the document of all of them.
async fn assemble(
    mut stream: Streaming<pb::ImportStreamRequest>,
) -> Result<pb::ImportRequest, Status> {
    let mut bytes = Vec::new();
    let mut options = None;
    while let Some(piece) = stream.message().await? {
        options.get_or_insert((piece.replace, piece.lead_ms));
        if bytes.len() + piece.chunk.len() > MAX_IMPORT_DOCUMENT {
            return Err(too_large(bytes.len() + piece.chunk.len()));
        }
        bytes.extend_from_slice(&piece.chunk);
    }
    let (replace, lead_ms) = options.unwrap_or_default();
    let document = String::from_utf8(bytes).map_err(|e| {
        Status::invalid_argument(format!(
            "the document is not UTF-8 text (byte {} is not): send the file Export or ExportStream wrote",
            e.utf8_error().valid_up_to()
        ))
    })?;
    Ok(pb::ImportRequest {
        document,
        replace,
        lead_ms,
    })
}

impl<S: AdminStore> StateAdmin<S> {
    /// See `AdminService.ExportStream`.
    pub async fn export_stream(
        &self,
        _request: Request<pb::ExportStreamRequest>,
    ) -> Result<Response<ExportStream>, Status> {
        let document = self.export_document().await?;
        let pieces = pieces(document, self.export_chunk());
        Ok(Response::new(Box::pin(tokio_stream::iter(pieces))))
    }

    /// See `AdminService.ImportStream`.
    pub async fn import_stream(
        &self,
        request: Request<Streaming<pb::ImportStreamRequest>>,
    ) -> Result<Response<pb::ImportStreamResponse>, Status> {
        let who = Who::of(request.extensions());
        let req = assemble(request.into_inner()).await?;
        let imported = self.import_audited(who, &req).await?;
        Ok(Response::new(pb::ImportStreamResponse {
            imported: Some(imported),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_fits_the_send_limit_and_the_pieces_are_the_document() {
        assert_eq!(export_chunk(1024), 1016);
        assert_eq!(export_chunk(1 << 20), 64 << 10);
        assert_eq!(export_chunk(0), 1);
        let doc = "é".repeat(3000);
        let got = pieces(doc.clone(), 1016);
        assert_eq!(got.len(), 6);
        let mut joined = Vec::new();
        for p in got {
            let p = p.unwrap_or_default();
            assert!(p.chunk.len() <= 1016);
            joined.extend(p.chunk);
        }
        assert_eq!(String::from_utf8(joined).ok(), Some(doc));
    }
}
