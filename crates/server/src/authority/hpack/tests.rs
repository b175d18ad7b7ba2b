//! Our decoder against RFC 7541's examples and, differentially, against loona-hpack.

use loona_hpack::{Decoder as Other, Encoder};

use super::*;

type List = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes `block` with `decoder` and reads every value, as a list.
fn decode(decoder: &mut Decoder, block: &[u8]) -> Result<List, Error> {
    let mut fields = Fields::new(1 << 20);
    decoder.decode(block, &mut fields)?;
    fields.resolve(block)?;
    Ok(fields
        .iter()
        .map(|(n, v, _)| (n.to_vec(), v.to_vec()))
        .collect())
}

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

fn list(fields: &[(&str, &str)]) -> List {
    fields
        .iter()
        .map(|(n, v)| (n.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

#[test]
fn integers_as_rfc_7541_shows() {
    // C.1.1 to C.1.3, and a 7-bit prefix value exactly at the prefix's maximum.
    for (value, prefix, bytes) in [
        (10, 5, &[0x0a][..]),
        (1337, 5, &[0x1f, 0x9a, 0x0a]),
        (42, 8, &[0x2a]),
        (127, 7, &[0x7f, 0x00]),
    ] {
        let mut out = Vec::new();
        encode_integer(value, prefix, 0, &mut out);
        assert_eq!(out, bytes, "encode {value}");
        assert_eq!(
            integer(bytes, prefix),
            Ok((value, bytes.len())),
            "decode {value}"
        );
    }
    assert_eq!(integer(&[0x1f, 0x9a], 5), Err(Error::Integer), "cut short");
    assert_eq!(
        integer(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0x01], 5),
        Err(Error::Integer),
        "beyond 2^28"
    );
}

#[test]
fn rfc_7541_request_examples_with_huffman() {
    // C.4: three requests on one connection, Huffman coded, with the dynamic table.
    let mut decoder = Decoder::new(4096);
    let blocks = [
        (
            "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
            list(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
            ]),
        ),
        (
            "8286 84be 5886 a8eb 1064 9cbf",
            list(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache"),
            ]),
        ),
        (
            "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
            list(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value"),
            ]),
        ),
    ];
    for (bytes, want) in blocks {
        assert_eq!(decode(&mut decoder, &hex(bytes)), Ok(want), "{bytes}");
    }
    // C.4.3's table: three entries, 164 bytes.
    assert_eq!(decoder.table.len(), 3);
    assert_eq!(decoder.table_bytes, 164);
}

#[test]
fn static_table_as_another_decoder_reads_it() {
    for index in 1..=STATIC_LEN {
        let block = [0x80 | index as u8];
        let want = Other::new().decode(&block).unwrap();
        assert_eq!(decode(&mut Decoder::new(4096), &block), Ok(want), "{index}");
    }
    assert_eq!(
        decode(&mut Decoder::new(4096), &[0x80 | 62]),
        Err(Error::Index)
    );
    assert_eq!(decode(&mut Decoder::new(4096), &[0x80]), Err(Error::Index));
}

/// Every symbol's code, from the canonical construction, bit by bit.
fn huffman_encode(text: &[u8]) -> Vec<u8> {
    let c = &CANONICAL;
    let mut bits: Vec<bool> = Vec::new();
    for &byte in text {
        let len = usize::from(HUFFMAN_CODE_BITS[usize::from(byte)]);
        let rank = c.symbols[c.first_symbol[len]..c.first_symbol[len] + c.count[len] as usize]
            .iter()
            .position(|&s| s == u16::from(byte))
            .unwrap();
        let code = c.first_code[len] + rank as u32;
        bits.extend((0..len).rev().map(|i| code >> i & 1 == 1));
    }
    while !bits.len().is_multiple_of(8) {
        bits.push(true);
    }
    bits.chunks(8)
        .map(|byte| byte.iter().fold(0, |acc, &bit| acc << 1 | u8::from(bit)))
        .collect()
}

#[test]
fn every_huffman_code_as_another_decoder_reads_it() {
    // A literal without indexing whose value is every byte value, Huffman coded by us: the
    // other decoder reads what the RFC's table says, so every code length here is checked.
    let text: Vec<u8> = (0..=255).chain((0..=255).rev()).collect();
    let coded = huffman_encode(&text);
    let mut block = vec![0x00, 0x01, b'x'];
    encode_integer(coded.len(), 7, 0x80, &mut block);
    block.extend_from_slice(&coded);
    let want = vec![(b"x".to_vec(), text)];
    assert_eq!(Other::new().decode(&block).unwrap(), want);
    assert_eq!(decode(&mut Decoder::new(4096), &block), Ok(want));
    // The code is complete: the lengths fill the code space exactly (Kraft's equality).
    let space: u64 = HUFFMAN_CODE_BITS.iter().map(|&b| 1u64 << (30 - b)).sum();
    assert_eq!(space, 1 << 30);
}

#[test]
fn bad_huffman_is_refused() {
    let mut out = Vec::new();
    // "a" is 00011; padded with ones it is 0x1f.
    assert_eq!(huffman_decode(&[0x1f], &mut out), Ok(()));
    assert_eq!(out, b"a");
    for (bytes, why) in [
        (&[0x18][..], "padding not all ones"),
        (&[0x1f, 0xff], "padding of 8 bits or more"),
        (&[0xff, 0xff, 0xff, 0xfc], "EOS in the string"),
    ] {
        assert_eq!(
            huffman_decode(bytes, &mut Vec::new()),
            Err(Error::Huffman),
            "{why}"
        );
    }
}

#[test]
fn size_updates_only_first_and_within_bounds() {
    let mut decoder = Decoder::new(4096);
    // 0x3f 0xe1 0x1f: a size update to 31 + 0x61 + (0x1f << 7) = 4096.
    assert_eq!(
        decode(&mut decoder, &[0x20, 0x3f, 0xe1, 0x1f, 0x82]),
        Ok(list(&[(":method", "GET")]))
    );
    assert_eq!(decoder.table_bytes_max, 4096);
    assert_eq!(
        decode(&mut decoder, &[0x3f, 0xe2, 0x1f]),
        Err(Error::SizeUpdate),
        "4097 > 4096"
    );
    assert_eq!(
        decode(&mut Decoder::new(4096), &[0x82, 0x20]),
        Err(Error::SizeUpdate),
        "after a field"
    );
}

#[test]
fn the_dynamic_table_as_another_decoder_keeps_it() {
    // Blocks from an indexing encoder, with values of every size (so entries are evicted) and
    // table size updates; both decoders must read every block alike.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move |bound: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % bound
    };
    let mut encoder = Encoder::new();
    let mut other = Other::new();
    let mut ours = Decoder::new(4096);
    for round in 0..500 {
        let mut block = Vec::new();
        if round % 50 == 49 {
            let size = next(4097) as usize;
            encode_integer(size, 5, 0x20, &mut block);
            encoder.set_max_table_size(size);
        }
        let fields: List = (0..1 + next(8))
            .map(|_| {
                let name = format!("x-{}", next(20)).into_bytes();
                let value = vec![b'a' + next(26) as u8; next(1500) as usize];
                (name, value)
            })
            .collect();
        encoder
            .encode_into(fields.iter().map(|(n, v)| (&n[..], &v[..])), &mut block)
            .unwrap();
        let want = other.decode(&block).unwrap();
        assert_eq!(want, fields);
        assert_eq!(decode(&mut ours, &block), Ok(want), "round {round}");
    }
}

#[test]
fn values_are_decoded_only_when_asked() {
    // `:path` without indexing, Huffman coded, then `:authority` with incremental indexing.
    let mut block = vec![0x04];
    let path = huffman_encode(b"/etcdserverpb.KV/Put");
    encode_integer(path.len(), 7, 0x80, &mut block);
    block.extend_from_slice(&path);
    block.extend_from_slice(&[0x41, 0x03]);
    block.extend_from_slice(b"a:1");
    let mut decoder = Decoder::new(4096);
    let mut fields = Fields::new(1 << 20);
    decoder.decode(&block, &mut fields).unwrap();
    assert!(matches!(fields.list[0].value, Value::Wire(_)));
    assert!(matches!(fields.list[1].value, Value::Decoded(_)));
    let at = fields.find(b":authority").unwrap();
    assert_eq!(fields.value(at, &block), Ok(&b"a:1"[..]));
    assert_eq!(fields.value(0, &block), Ok(&b"/etcdserverpb.KV/Put"[..]));
}
