//! Fuzz target: one request frame, as a broker receives it. Checks the size prefix against a
//! limit, parses the header, decodes the body through `wire::messages` (kafka-protocol) for
//! whatever (api key, version) the header names, and through the hand-written Produce view.
//! Nothing may panic; decoding must never claim more bytes than the frame holds.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use wire::frame::{FrameStatus, check_frame, parse_request_header};
use wire::produce::ProduceRequestView;

const MAX_FRAME_BYTES: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    // Exercise framing on the raw bytes, then treat the input as a frame body regardless,
    // so the decoders see every input.
    if let Ok(FrameStatus::Complete { size }) = check_frame(data, MAX_FRAME_BYTES) {
        assert!(4 + size <= data.len());
    }
    let frame = Bytes::copy_from_slice(data);
    let Ok((header, body_at)) = parse_request_header(&frame) else {
        return;
    };
    assert!(body_at <= frame.len());
    let body = frame.slice(body_at..);
    let _ = wire::messages::decode_request(header.api_key, header.api_version, body.clone());
    if header.api_key == wire::api::PRODUCE
        && let Ok(view) = ProduceRequestView::parse(&body, header.api_version)
    {
        for topic in &view.topics {
            for p in &topic.partitions {
                if let Some(records) = &p.records {
                    assert!(records.len() <= body.len());
                    for batch in wire::batch::split_batches(records) {
                        let _ = batch;
                    }
                }
            }
        }
    }
});
