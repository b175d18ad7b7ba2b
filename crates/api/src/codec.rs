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

/// Encodes a prost message into room reserved for all of it.
#[derive(Debug)]
pub struct SizedEncoder<T>(PhantomData<T>);

impl<T: Message> Encoder for SizedEncoder<T> {
    type Item = T;
    type Error = Status;

    fn encode(&mut self, item: T, buf: &mut EncodeBuf<'_>) -> Result<(), Status> {
        buf.reserve(item.encoded_len());
        item.encode(buf)
            .map_err(|e| Status::internal(format!("encoding a message: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}
