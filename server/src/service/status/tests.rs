use std::time::Duration;

use snowkeep_client::{MachineId, Millis};

use super::*;
use snowkeep_core::lease::skew::SkewDirection;

#[test]
fn each_error_maps_to_its_code() {
    let table: Vec<(ApiError, Code)> = vec![
        (ApiError::count(0), Code::InvalidArgument),
        (
            ApiError::InvalidBatchSize { got: 1, max: 1 },
            Code::InvalidArgument,
        ),
        (
            ApiError::InvalidId {
                id: 1 << 63,
                max: (1 << 63) - 1,
                layout: "41/12/10@1767225600000".into(),
                bits: 63,
            },
            Code::InvalidArgument,
        ),
        (
            ApiError::InvalidIdText(snowkeep_client::TextIdError::WrongLength {
                text: "1".into(),
                got: 1,
                expected: 13,
                total_bits: 63,
            }),
            Code::InvalidArgument,
        ),
        (
            ApiError::IdAndText {
                id: 1,
                text: "0000000000001".into(),
            },
            Code::InvalidArgument,
        ),
        (ApiError::InvalidIdFormat { got: 2 }, Code::InvalidArgument),
        (
            ApiError::Store(StoreError::Timeout {
                op: "x",
                after: Duration::ZERO,
            }),
            Code::Unavailable,
        ),
        (
            ApiError::Store(StoreError::UnknownNamespace {
                namespace: "x".into(),
            }),
            Code::NotFound,
        ),
        (
            ApiError::Store(StoreError::NoFreeMachineId {
                namespace: "x".into(),
                capacity: 1,
                start: 0,
                end: 1,
            }),
            Code::ResourceExhausted,
        ),
        (
            ApiError::Store(StoreError::CountMismatch { held: 1, asked: 2 }),
            Code::AlreadyExists,
        ),
        (
            ApiError::ClientClockSkew {
                skew: Duration::from_secs(900),
                direction: SkewDirection::Behind,
                threshold: Duration::from_secs(600),
            },
            Code::FailedPrecondition,
        ),
        (
            ApiError::ClientClockSkew {
                skew: Duration::from_secs(900),
                direction: SkewDirection::Ahead,
                threshold: Duration::from_secs(600),
            },
            Code::FailedPrecondition,
        ),
        (
            ApiError::Store(StoreError::InvalidNamespace {
                namespace: ".".into(),
            }),
            Code::InvalidArgument,
        ),
        (ApiError::LeaseApiNeedsEtcd, Code::FailedPrecondition),
        (
            ApiError::Store(StoreError::NamespaceRolledBack {
                namespace: "x".into(),
                since: "2026-12-01T10:00:00Z".into(),
                reason: "r".into(),
            }),
            Code::FailedPrecondition,
        ),
        (
            ApiError::Store(StoreError::NamespaceNeedsFloor {
                namespace: "x".into(),
                endpoints: "http://127.0.0.1:2379".into(),
                snapshot: "sha256 ab, revision 4".into(),
            }),
            Code::FailedPrecondition,
        ),
        (
            ApiError::Store(StoreError::TokenRefused { reason: "x" }),
            Code::PermissionDenied,
        ),
        (ApiError::InvalidLeaseToken, Code::InvalidArgument),
        (ApiError::StoreNotConnected, Code::Unavailable),
        (
            ApiError::InvalidRequester { reason: "x" },
            Code::InvalidArgument,
        ),
        (
            ApiError::InvalidNamespace {
                namespace: "x".into(),
            },
            Code::InvalidArgument,
        ),
        (
            ApiError::InvalidLeaseCount { got: 0, max: 256 },
            Code::InvalidArgument,
        ),
        (
            LimitError::Busy {
                calls: "streams",
                max: 1,
                flag: "--max-open-streams",
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::MemoryInUse {
                calls: "streams",
                need: 1,
                pool: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::CallTooLarge {
                calls: "streams",
                need: 2,
                pool: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::RequestTooLarge { len: 2, max: 1 }.into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::IdsTooLarge {
                count: 2,
                len: 2,
                max: 1,
                fit: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::BatchTooLarge {
                batch: 2,
                len: 2,
                max: 1,
                fit: 1,
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::ResponseTooLarge { len: 2, max: 1 }.into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::KeyBusy {
                key_id: "k".into(),
                calls: "streams",
                max: 1,
                flag: "--max-streams-per-key",
            }
            .into(),
            Code::ResourceExhausted,
        ),
        (
            LimitError::RequestTimeout {
                after: Duration::from_secs(1),
            }
            .into(),
            Code::DeadlineExceeded,
        ),
        (
            LimitError::InvalidMessage { detail: "x".into() }.into(),
            Code::InvalidArgument,
        ),
        (LimitError::TruncatedMessage.into(), Code::InvalidArgument),
        (
            LimitError::InvalidCompressionFlag { flag: 7 }.into(),
            Code::InvalidArgument,
        ),
        (GenerateError::NoGrant.into(), Code::Unavailable),
        (GenerateError::LeaseExpired.into(), Code::Unavailable),
        (
            GenerateError::ClockBehindFloor {
                wait: Duration::ZERO,
            }
            .into(),
            Code::Unavailable,
        ),
        (
            GenerateError::FenceReached { fence: Millis(1) }.into(),
            Code::Unavailable,
        ),
        (
            GenerateError::ClockSteppedBack {
                by: Duration::ZERO,
                max: Duration::ZERO,
            }
            .into(),
            Code::Unavailable,
        ),
        (GenerateError::ClockBeforeEpoch.into(), Code::Unavailable),
        (
            GenerateError::LayoutExhausted { max: Millis(1) }.into(),
            Code::FailedPrecondition,
        ),
        (ended(StreamEnd::Shutdown), Code::Unavailable),
        (
            ended(StreamEnd::MachineIdChanged {
                from: MachineId(1),
                to: MachineId(2),
            }),
            Code::Unavailable,
        ),
        (
            ended(StreamEnd::Generate(GenerateError::NoGrant)),
            Code::Unavailable,
        ),
        (
            ended(StreamEnd::Generate(GenerateError::LeaseExpired)),
            Code::Unavailable,
        ),
        (
            ended(StreamEnd::Generate(GenerateError::ClockSteppedBack {
                by: Duration::ZERO,
                max: Duration::ZERO,
            })),
            Code::Unavailable,
        ),
        (
            ended(StreamEnd::Generate(GenerateError::FenceReached {
                fence: Millis(1),
            })),
            Code::Unavailable,
        ),
        (
            ended(StreamEnd::Generate(GenerateError::LayoutExhausted {
                max: Millis(1),
            })),
            Code::FailedPrecondition,
        ),
    ];
    for (err, code) in table {
        assert_eq!(Status::from(err).code(), code);
    }
}

fn ended(cause: StreamEnd) -> ApiError {
    ApiError::StreamEnded {
        sent: 1000,
        total: 5000,
        cause,
    }
}

#[test]
fn a_stream_that_ends_early_counts_sent_and_asked_and_says_what_to_do() {
    let message = |sent, total, cause| {
        Status::from(ApiError::StreamEnded { sent, total, cause })
            .message()
            .to_owned()
    };
    assert_eq!(
        message(1000, 5000, StreamEnd::Shutdown),
        "stream ended early: 1000 of 5000 ids sent; this server is shutting down; \
         ask for the remaining 4000 ids on another snowkeep server"
    );
    assert_eq!(
        message(0, 5000, StreamEnd::Generate(GenerateError::NoGrant)),
        "stream ended early: 0 of 5000 ids sent; no valid machine-id lease is held; \
         ask for the remaining 5000 ids on another snowkeep server, or on this one once it is ready again"
    );
    assert_eq!(
        message(
            2048,
            3000,
            StreamEnd::MachineIdChanged {
                from: MachineId(5),
                to: MachineId(9)
            }
        ),
        "stream ended early: 2048 of 3000 ids sent; the lease on machine id 5 was lost \
         and this server now issues from machine id 9; ask for the remaining 952 ids on \
         another snowkeep server, or on this one once it is ready again"
    );
    // Not retryable: no remedy that would fail again.
    assert_eq!(
        message(
            7,
            9,
            StreamEnd::Generate(GenerateError::LayoutExhausted { max: Millis(3) })
        ),
        "stream ended early: 7 of 9 ids sent; clock is past the layout's last timestamp 3ms"
    );
    // An unbounded stream (total 0) ended by shutdown says so too.
    assert_eq!(
        message(123_000, 0, StreamEnd::Shutdown),
        "stream ended: 123000 ids sent; this server is shutting down; \
         open a new stream on another snowkeep server"
    );
    assert_eq!(
        message(
            1,
            0,
            StreamEnd::Generate(GenerateError::FenceReached { fence: Millis(8) })
        ),
        "stream ended: 1 id sent; clock reached the persisted fence 8ms that has not been raised; \
         open a new stream on another snowkeep server, or on this one once it is ready again"
    );
}

#[test]
fn a_skew_refusal_names_skew_direction_threshold_and_remedy() {
    let s = Status::from(ApiError::ClientClockSkew {
        skew: Duration::from_secs(900),
        direction: SkewDirection::Behind,
        threshold: Duration::from_secs(600),
    });
    assert_eq!(
        s.message(),
        "client clock is 15m behind the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry"
    );
    let s = Status::from(ApiError::ClientClockSkew {
        skew: Duration::from_secs(1200),
        direction: SkewDirection::Ahead,
        threshold: Duration::from_secs(600),
    });
    assert_eq!(
        s.message(),
        "client clock is 20m ahead of the server, over the 10m threshold: sync this host with NTP (chrony/ntpd), then retry"
    );
}

#[test]
fn count_error_names_the_allowed_range() {
    let s = Status::from(ApiError::count(0));
    assert_eq!(s.message(), "count must be between 1 and 100000, got 0");
}

/// Moved from the guard's `limits::error`: the guard's `From<LimitError> for
/// Status` and this module's `ApiError::Limit` read the same.
#[test]
fn a_refusal_reads_the_same_from_the_layers_and_from_a_handler() {
    let refusals = [
        LimitError::Busy {
            calls: "streams",
            max: 1,
            flag: "--max-open-streams",
        },
        LimitError::RequestTimeout {
            after: Duration::from_secs(1),
        },
        LimitError::TruncatedMessage,
    ];
    for refusal in refusals {
        let layer = Status::from(refusal.clone());
        let handler = Status::from(ApiError::from(refusal));
        assert_eq!(layer.code(), handler.code());
        assert_eq!(layer.message(), handler.message());
    }
}
