//! Ids as text (`IdFormat::CrockfordBase32`) from a real single-instance
//! server: unary batches and streams carry texts parallel to the ids that
//! decode to exactly those ids and sort like them, and DecodeId reads a
//! text like the number, refusing a bad one with INVALID_ARGUMENT; the Rust
//! remote client asks for texts.

use std::time::Duration;

use snowkeep_client::{text_id, RemoteClient, RemoteConfig};
use snowkeep_proto::v1 as pb;
use tonic::Code;

use snowkeep_test_support::server::ServerProcess;

const READY: Duration = Duration::from_secs(20);
const BASE32: i32 = pb::IdFormat::CrockfordBase32 as i32;

/// A serving single-instance server on a temp state folder (kept alive with it).
async fn serving() -> (ServerProcess, tempfile::TempDir) {
    let state = tempfile::tempdir().unwrap();
    let server = ServerProcess::spawn(&["--state-dir", state.path().to_str().unwrap()]);
    server.wait_serving(READY).await;
    (server, state)
}

/// The id `text` stands for, by hand: 5 bits per character, in Crockford's
/// alphabet. Independent of the codec under test.
fn by_hand(text: &str) -> u64 {
    const ALPHABET: &str = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    text.chars().fold(0, |acc, c| {
        (acc << 5)
            | ALPHABET
                .find(c)
                .unwrap_or_else(|| panic!("{c:?} in {text}")) as u64
    })
}

/// Each text is 13 characters of the alphabet, stands for exactly its id,
/// and the texts ascend as strings like the ids do.
fn assert_texts_are_the_ids(ids: &[u64], texts: &[String]) {
    assert_eq!(texts.len(), ids.len());
    for (id, text) in ids.iter().zip(texts) {
        assert_eq!(text.len(), 13, "{text}");
        assert_eq!(by_hand(text), *id, "{text}");
        assert_eq!(text_id::decode(text, 63), Ok(*id));
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids ascend");
    assert!(texts.windows(2).all(|w| w[0] < w[1]), "texts ascend");
    let mut sorted = texts.to_vec();
    sorted.sort();
    assert_eq!(sorted, texts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn next_ids_with_the_text_format_returns_texts_that_are_exactly_the_ids() {
    let (server, _state) = serving().await;
    let mut ids = server.ids().await;
    let numbers = ids
        .next_ids(pb::NextIdsRequest {
            count: 5,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(numbers.ids.len(), 5);
    assert!(numbers.texts.is_empty(), "no format, no texts");

    let both = ids
        .next_ids(pb::NextIdsRequest {
            count: 3000,
            format: BASE32,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(both.ids.len(), 3000);
    assert!(both.ids[0] > numbers.ids[4]);
    assert_texts_are_the_ids(&both.ids, &both.texts);

    let refused = ids
        .next_ids(pb::NextIdsRequest {
            count: 1,
            format: 9,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(
        refused.message(),
        "format 9 is not an IdFormat this server knows: use 0 (ID_FORMAT_UNSPECIFIED, numbers \
         only) or 1 (ID_FORMAT_CROCKFORD_BASE32, numbers and texts)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_with_the_text_format_carries_texts_in_every_batch() {
    let (server, _state) = serving().await;
    let mut stream = server
        .ids()
        .await
        .stream_ids(pb::StreamIdsRequest {
            total: 2500,
            batch_size: 1000,
            format: BASE32,
        })
        .await
        .unwrap()
        .into_inner();
    let (mut all_ids, mut all_texts, mut sizes) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(batch) = stream.message().await.unwrap() {
        assert_eq!(batch.texts.len(), batch.ids.len());
        sizes.push(batch.ids.len());
        all_ids.extend(batch.ids);
        all_texts.extend(batch.texts);
    }
    assert_eq!(sizes, [1000, 1000, 500]);
    // Across batches too: one stream, one machine id, ascending.
    assert_texts_are_the_ids(&all_ids, &all_texts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_id_reads_a_text_like_the_number_and_names_a_bad_character() {
    let (server, _state) = serving().await;
    let id = server.next_ids(1).await.unwrap()[0];
    let mut info = pb::info_service_client::InfoServiceClient::new(server.channel().await);
    let decode = |id: u64, text: &str| pb::DecodeIdRequest {
        id,
        text: text.to_owned(),
    };
    let by_number = info.decode_id(decode(id, "")).await.unwrap().into_inner();
    assert!(by_number.unix_ms > 1_767_225_600_000, "{by_number:?}");
    assert_eq!(by_number.machine_id, 0);
    let text = text_id::encode(id, 63);
    for form in [text.clone(), text.to_ascii_lowercase()] {
        let by_text = info.decode_id(decode(0, &form)).await.unwrap().into_inner();
        assert_eq!(by_text, by_number, "{form}");
    }
    // The smallest and largest texts, exactly.
    let zero = info
        .decode_id(decode(0, "0000000000000"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        zero,
        pb::DecodeIdResponse {
            timestamp_ms: 0,
            unix_ms: 1_767_225_600_000,
            machine_id: 0,
            sequence: 0,
        }
    );
    let max = info
        .decode_id(decode(0, "7zzzzzzzzzzzz"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        max,
        pb::DecodeIdResponse {
            timestamp_ms: (1 << 41) - 1,
            unix_ms: 1_767_225_600_000 + (1 << 41) - 1,
            machine_id: 4095,
            sequence: 1023,
        }
    );

    let refused = |text: &str, id: u64| {
        let mut info = info.clone();
        let req = decode(id, text);
        async move { info.decode_id(req).await.unwrap_err() }
    };
    let bad = refused("0000000U00000", 0).await;
    assert_eq!(bad.code(), Code::InvalidArgument);
    assert_eq!(
        bad.message(),
        "id text \"0000000U00000\" has 'U' at position 8, which is not a Crockford base32 digit \
         (0-9 and A-Z except U; I and L read as 1, O as 0)"
    );
    let short = refused("7ZZZ", 0).await;
    assert_eq!(short.code(), Code::InvalidArgument);
    assert_eq!(
        short.message(),
        "id text \"7ZZZ\" has 4 characters; ids of a 63-bit layout are exactly 13 Crockford \
         base32 characters"
    );
    let over = refused("8000000000000", 0).await;
    assert_eq!(over.code(), Code::InvalidArgument);
    assert_eq!(
        over.message(),
        "id text \"8000000000000\" is 9223372036854775808 or more, above the largest id \
         9223372036854775807 of a 63-bit layout (largest text 7ZZZZZZZZZZZZ)"
    );
    let both = refused(&text, id).await;
    assert_eq!(both.code(), Code::InvalidArgument);
    assert_eq!(
        both.message(),
        format!(
            "send the id either as a number (id) or as text (text), not both: got id {id} and \
             text \"{text}\""
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_remote_client_asks_for_texts() {
    let (server, _state) = serving().await;
    let client = RemoteClient::new(&[server.url()], RemoteConfig::default()).unwrap();
    let pairs = client.next_ids_with_texts(100).await.unwrap();
    let (ids, texts): (Vec<u64>, Vec<String>) = pairs.into_iter().unzip();
    assert_eq!(ids.len(), 100);
    assert_texts_are_the_ids(&ids, &texts);

    let mut stream = client.stream_ids_with_texts(1500, 1000).await.unwrap();
    let (mut all_ids, mut all_texts) = (Vec::new(), Vec::new());
    while let Some(batch) = stream.message().await.unwrap() {
        all_ids.extend(batch.ids);
        all_texts.extend(batch.texts);
    }
    assert_eq!(all_ids.len(), 1500);
    assert!(all_ids[0] > ids[99]);
    assert_texts_are_the_ids(&all_ids, &all_texts);
}
