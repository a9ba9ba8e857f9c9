//! API keys on the client side: [`ApiKey`] is sent as `authorization:
//! Bearer <id>.<secret>` metadata on every call of a client configured with
//! one (needed while the cluster requires API keys). Without a key nothing
//! is sent.

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// An API key, `<id>.<secret>` as `snowkeepctl key create` printed it.
/// `Debug` shows the id only.
#[derive(Clone)]
pub struct ApiKey {
    id: String,
    header: MetadataValue<Ascii>,
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}.<secret>)", self.id)
    }
}

/// A key that cannot be sent: not `<id>.<secret>`, or characters a header
/// cannot carry. The key itself is never part of the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid API key: {0}; an API key is `<id>.<secret>` as `snowkeepctl key create` printed it"
)]
pub struct InvalidApiKey(&'static str);

/// A fresh random key as text, `<id>.<secret>`: the id is `k` and 12 hex
/// digits (48 random bits), the secret 64 hex digits (32 random bytes), both
/// from the operating system's generator through `rand`. Servers create keys
/// this way (CreateKey), and `snowkeepctl key generate` prints one for
/// `--bootstrap-admin-key-file`.
pub fn generate_key() -> String {
    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }
    let id: [u8; 6] = rand::random();
    let secret: [u8; 32] = rand::random();
    format!("k{}.{}", hex(&id), hex(&secret))
}

impl ApiKey {
    /// The key `text` (surrounding whitespace ignored).
    pub fn new(text: &str) -> Result<Self, InvalidApiKey> {
        let text = text.trim();
        let (id, secret) = text
            .split_once('.')
            .ok_or(InvalidApiKey("there is no dot"))?;
        if id.is_empty() || secret.is_empty() {
            return Err(InvalidApiKey("the id or the secret is empty"));
        }
        let header = MetadataValue::try_from(format!("Bearer {text}"))
            .map_err(|_| InvalidApiKey("it has characters a header cannot carry"))?;
        Ok(Self {
            id: id.to_owned(),
            header,
        })
    }

    /// The key in the first line of the file at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, InvalidApiKey> {
        let text = std::fs::read_to_string(path)
            .map_err(|_| InvalidApiKey("the key file cannot be read"))?;
        Self::new(text.lines().next().unwrap_or_default())
    }

    /// The key id (the part before the dot).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The `authorization` metadata value, `Bearer <id>.<secret>`, for
    /// clients that build their own metadata (it holds the secret: never
    /// log it).
    pub fn authorization(&self) -> MetadataValue<Ascii> {
        self.header.clone()
    }
}

/// Adds the key (if any) to every request of a channel.
#[derive(Clone, Debug, Default)]
pub struct SendApiKey(pub Option<ApiKey>);

impl tonic::service::Interceptor for SendApiKey {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(key) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", key.header.clone());
        }
        Ok(request)
    }
}

/// A channel that sends the API key.
pub type KeyedChannel = InterceptedService<Channel, SendApiKey>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn a_key_is_sent_as_bearer_metadata_and_never_shown() {
        let key = ApiKey::new(" k1.s3cr3tvalue \n").unwrap();
        assert_eq!(key.id(), "k1");
        assert!(!format!("{key:?}").contains("s3cr3t"));
        let sent = SendApiKey(Some(key)).call(tonic::Request::new(())).unwrap();
        assert_eq!(
            sent.metadata().get("authorization").unwrap(),
            "Bearer k1.s3cr3tvalue"
        );
        let generated = generate_key();
        let (id, secret) = generated.split_once('.').unwrap();
        assert_eq!((id.len(), secret.len()), (13, 64));
        assert!(id.starts_with('k'));
        assert!(generated[1..]
            .bytes()
            .all(|b| b == b'.' || b.is_ascii_hexdigit()));
        assert_ne!(generate_key(), generated);
        let none = SendApiKey(None).call(tonic::Request::new(())).unwrap();
        assert!(none.metadata().get("authorization").is_none());
        assert!(ApiKey::new("nodot").is_err());
        assert!(ApiKey::new("k1.bad\nkey").is_err());
    }
}
