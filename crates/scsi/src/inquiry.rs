//! INQUIRY: standard data and the VPD pages 0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2.

use crate::backend::Geometry;
use crate::lun::{MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS};
use crate::sense::Sense;
use crate::wire::{push_be, put_be};

/// T10 vendor identification (8 bytes, space padded).
pub const VENDOR: &[u8; 8] = b"MARINER ";
/// Product identification (16 bytes).
pub const PRODUCT: &[u8; 16] = b"VOLUME          ";
/// Product revision (4 bytes).
pub const REVISION: &[u8; 4] = b"0001";

/// VPD pages served, in ascending order.
pub const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2];

/// Builds the INQUIRY data (before clipping to the allocation length).
pub fn inquiry(g: &Geometry, evpd: bool, page: u8) -> Result<Vec<u8>, Sense> {
    if !evpd {
        return Ok(standard());
    }
    match page {
        0x00 => Ok(vpd(0x00, VPD_PAGES.to_vec())),
        0x80 => Ok(vpd(0x80, serial(g))),
        0x83 => Ok(vpd(0x83, device_identification(g))),
        0xb0 => Ok(vpd(0xb0, block_limits(g))),
        0xb1 => Ok(vpd(0xb1, block_characteristics())),
        0xb2 => Ok(vpd(0xb2, provisioning(g))),
        _ => Err(Sense::invalid_field_in_cdb(2)),
    }
}

fn standard() -> Vec<u8> {
    let mut out = vec![0u8; 96];
    out[0] = 0x00; // connected direct-access block device
    out[1] = 0x00; // not removable
    out[2] = 0x06; // SPC-4
    out[3] = 0x12; // HISUP, response data format 2
    out[4] = (out.len() - 5) as u8;
    out[7] = 0x02; // CMDQUE
    out[8..16].copy_from_slice(VENDOR);
    out[16..32].copy_from_slice(PRODUCT);
    out[32..36].copy_from_slice(REVISION);
    // Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
    for (i, v) in [0x00a0u64, 0x0960, 0x0460, 0x04c0].iter().enumerate() {
        put_be(&mut out[58 + 2 * i..60 + 2 * i], *v);
    }
    out
}

fn vpd(page: u8, body: Vec<u8>) -> Vec<u8> {
    let mut out = vec![0x00, page];
    push_be(&mut out, body.len() as u64, 2);
    out.extend_from_slice(&body);
    out
}

fn serial(g: &Geometry) -> Vec<u8> {
    let mut s: Vec<u8> = g
        .serial
        .bytes()
        .filter(|b| b.is_ascii_graphic())
        .take(64)
        .collect();
    if s.is_empty() {
        s.push(b'0');
    }
    s
}

fn device_identification(g: &Geometry) -> Vec<u8> {
    let mut out = Vec::new();
    // NAA IEEE Registered Extended (type 6): binary, designator type 3, LU association.
    let mut naa = g.naa_id;
    naa[0] = 0x60 | (naa[0] & 0x0f);
    out.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
    out.extend_from_slice(&naa);
    // T10 vendor ID based: ASCII, designator type 1.
    let mut t10 = VENDOR.to_vec();
    t10.extend_from_slice(&serial(g));
    out.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
    out.extend_from_slice(&t10);
    out
}

fn block_limits(g: &Geometry) -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    b[0] = 0x01; // WSNZ: WRITE SAME with zero blocks is refused
    b[1] = MAX_COMPARE_AND_WRITE_BLOCKS;
    put_be(&mut b[2..4], 1); // optimal transfer length granularity
    put_be(&mut b[4..8], u64::from(g.max_transfer_blocks));
    put_be(&mut b[8..12], u64::from(g.max_transfer_blocks));
    if g.can_unmap {
        put_be(&mut b[16..20], u64::from(MAX_UNMAP_BLOCKS));
        put_be(&mut b[20..24], u64::from(MAX_UNMAP_DESCRIPTORS));
        put_be(&mut b[24..28], 1);
    }
    put_be(
        &mut b[32..40],
        u64::from(MAX_UNMAP_BLOCKS.min(g.max_transfer_blocks)),
    ); // maximum WRITE SAME length
    b
}

fn block_characteristics() -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    put_be(&mut b[0..2], 1); // non-rotating medium
    b
}

fn provisioning(g: &Geometry) -> Vec<u8> {
    if !g.can_unmap {
        return vec![0, 0, 0, 0];
    }
    // LBPU, LBPWS, LBPWS10, LBPRZ=1 (bits 4..2 = 001); provisioning type 2 = thin.
    vec![0, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::BlockBackend;

    fn g() -> Geometry {
        MemoryBackend::new("SER1", 512, 1000).geometry()
    }

    #[test]
    fn standard_data() {
        let d = inquiry(&g(), false, 0).unwrap();
        assert_eq!(d[2], 6);
        assert_eq!(d[3] & 0x0f, 2);
        assert_eq!(d[4] as usize + 5, d.len());
        assert_eq!(&d[8..16], VENDOR);
        assert_eq!(d[1] & 0x80, 0, "not removable");
    }

    #[test]
    fn vpd_pages() {
        let d = inquiry(&g(), true, 0).unwrap();
        assert_eq!(&d[4..], &VPD_PAGES);
        let s = inquiry(&g(), true, 0x80).unwrap();
        assert_eq!(&s[4..], b"SER1");
        let id = inquiry(&g(), true, 0x83).unwrap();
        assert_eq!(id[1], 0x83);
        assert_eq!(id[4..8], [0x01, 0x03, 0x00, 16]);
        assert_eq!(id[8] >> 4, 6);
        let bl = inquiry(&g(), true, 0xb0).unwrap();
        assert_eq!(bl.len(), 0x40);
        assert_eq!(bl[5], MAX_COMPARE_AND_WRITE_BLOCKS);
        let lbp = inquiry(&g(), true, 0xb2).unwrap();
        assert_eq!(lbp[5] & 0x80, 0x80);
        assert_eq!(lbp[6] & 0x07, 2);
        assert_eq!(inquiry(&g(), true, 0xb1).unwrap()[5], 1);
        assert!(inquiry(&g(), true, 0x99).is_err());
    }
}
