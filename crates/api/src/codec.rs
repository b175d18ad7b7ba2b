//! The codec every generated stub uses: tonic-prost's, except that the encoder reserves a
//! message's whole encoded length before it writes it. tonic's send buffer otherwise grows by
//! doubling while prost writes into it, so a 100 MB range response was copied several times over
//! (and its fresh pages zeroed each time) on the runtime worker that encodes it: a fifth of the
//! server's time under big reads (docs/bench.md). Every gRPC call of every test goes through it.

use std::marker::PhantomData;

use prost::Message;
use tonic::Status;
use tonic::codec::{BufferSettings, Codec, EncodeBuf, Encoder};
use tonic_prost::{ProstCodec, ProstDecoder};

/// A [`Codec`] for prost messages `T` out and `U` in.
#[derive(Debug)]
pub struct SizedCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for SizedCodec<T, U> {
    fn default() -> Self {
        SizedCodec(PhantomData)
    }
}

impl<T, U> Codec for SizedCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = SizedEncoder<T>;
    type Decoder = ProstDecoder<U>;

    fn encoder(&mut self) -> SizedEncoder<T> {
        SizedEncoder(PhantomData)
    }

    fn decoder(&mut self) -> ProstDecoder<U> {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::default())
    }
}

/// A message at least this long is encoded with the runtime told that this worker blocks: a
/// gigabyte range response takes most of a second to copy, and a task woken meanwhile into this
/// worker's own slot (a put's answer, say) could not be stolen by the other workers until the
/// copy was done. `block_in_place` moves the worker's queue to another thread first.
pub const BLOCKING_ENCODE_BYTES: usize = 4 * 1024 * 1024;

fn on_multi_thread_runtime() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Encodes a prost message into room reserved for all of it.
#[derive(Debug)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        let len = item.encoded_len();
        buf.reserve(len);
        let mut encode = || {
            item.encode(buf)
                .map_err(|e| Status::internal(format!("encoding a message: {e}")))
        };
        if len >= BLOCKING_ENCODE_BYTES && on_multi_thread_runtime() {
            // The worker hands its queued tasks to another thread before it blocks (see
            // `BLOCKING_ENCODE_BYTES`).
            tokio::task::block_in_place(encode)
        } else {
            encode()
        }
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
