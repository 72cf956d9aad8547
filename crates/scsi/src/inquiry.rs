//! INQUIRY: standard data and the VPD pages 0x00, 0x80, 0x83, 0x8F, 0xB0, 0xB1, 0xB2.

use crate::backend::Geometry;
use crate::lun::{
    max_write_same_blocks, MAX_COMPARE_AND_WRITE_BLOCKS, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
};
use crate::sense::Sense;
use crate::wire::{push_be, put_be};

/// T10 vendor identification (8 bytes, space padded).
pub const VENDOR: &[u8; 8] = b"MARINER ";
/// Product identification (16 bytes).
pub const PRODUCT: &[u8; 16] = b"VOLUME          ";
/// Product revision (4 bytes).
pub const REVISION: &[u8; 4] = b"0001";

/// VPD pages served, in ascending order.
pub const VPD_PAGES: [u8; 7] = [0x00, 0x80, 0x83, 0x8f, 0xb0, 0xb1, 0xb2];

/// Builds the INQUIRY data (before clipping to the allocation length).
pub fn inquiry(g: &Geometry, evpd: bool, page: u8) -> Result<Vec<u8>, Sense> {
    if !evpd {
        return Ok(standard());
    }
    match page {
        0x00 => Ok(vpd(0x00, VPD_PAGES.to_vec())),
        0x80 => Ok(vpd(0x80, serial(g))),
        0x83 => Ok(vpd(0x83, device_identification(g))),
        0x8f => Ok(vpd(0x8f, crate::xcopy::third_party_copy_descriptors(g))),
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
    out[5] = 0x08; // 3PC: EXTENDED COPY is served (crate::xcopy)
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

/// The NAA IEEE Registered Extended designator (type 6) of the unit, as VPD page 0x83 reports
/// it and EXTENDED COPY identification descriptors name the unit.
pub fn naa_designator(g: &Geometry) -> [u8; 16] {
    let mut naa = g.naa_id;
    naa[0] = 0x60 | (naa[0] & 0x0f);
    naa
}

fn device_identification(g: &Geometry) -> Vec<u8> {
    let mut out = Vec::new();
    // NAA IEEE Registered Extended (type 6): binary, designator type 3, LU association.
    let naa = naa_designator(g);
    out.extend_from_slice(&[0x01, 0x03, 0x00, 16]);
    out.extend_from_slice(&naa);
    // T10 vendor ID based: ASCII, designator type 1.
    let mut t10 = VENDOR.to_vec();
    t10.extend_from_slice(&serial(g));
    out.extend_from_slice(&[0x02, 0x01, 0x00, t10.len() as u8]);
    out.extend_from_slice(&t10);
    out
}

/// Block Limits (SBC-4 6.6.4); `b[i]` is byte `i + 4` of the page.
fn block_limits(g: &Geometry) -> Vec<u8> {
    let mut b = vec![0u8; 0x3c];
    // WSNZ (b[0] bit 0) clear: WRITE SAME with zero blocks runs to the end of the medium.
    b[1] = MAX_COMPARE_AND_WRITE_BLOCKS;
    // Optimal transfer length granularity: a physical block (smaller writes cost the medium a
    // read-modify-write).
    let per_physical = u64::from(g.blocks_per_physical_block());
    put_be(&mut b[2..4], per_physical);
    put_be(&mut b[4..8], u64::from(g.max_transfer_blocks));
    put_be(&mut b[8..12], u64::from(g.max_transfer_blocks));
    if g.can_unmap {
        put_be(&mut b[16..20], u64::from(MAX_UNMAP_BLOCKS));
        put_be(&mut b[20..24], u64::from(MAX_UNMAP_DESCRIPTORS));
        // Optimal unmap granularity: a physical block, aligned at LBA 0 (UGAVALID); a partial
        // physical block is zeroed rather than deallocated.
        put_be(&mut b[24..28], per_physical);
        put_be(&mut b[28..32], 0x8000_0000);
    }
    put_be(&mut b[32..40], u64::from(max_write_same_blocks(g)));
    // Atomic writes: up to max_atomic_blocks at any LBA and of any length (alignment and
    // granularity zero); atomic boundaries are not supported (their two limits zero).
    put_be(&mut b[40..44], u64::from(g.max_atomic_blocks));
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
        assert_eq!(bl[4] & 1, 0, "WSNZ clear");
        assert_eq!(
            &bl[6..8],
            [0, 1],
            "no physical block larger than a logical one"
        );
        let max_atomic = crate::wire::be32(&bl[44..48]);
        assert_eq!(max_atomic, g().max_atomic_blocks);
        assert!(max_atomic > 0 && max_atomic <= crate::wire::be32(&bl[8..12]));
        assert_eq!(
            &bl[48..64],
            [0; 16],
            "no alignment, granularity or boundaries"
        );
        let lbp = inquiry(&g(), true, 0xb2).unwrap();
        assert_eq!(lbp[5] & 0x80, 0x80);
        assert_eq!(lbp[6] & 0x07, 2);
        assert_eq!(inquiry(&g(), true, 0xb1).unwrap()[5], 1);
        assert!(inquiry(&g(), true, 0x99).is_err());
    }

    #[test]
    fn block_limits_granularities_follow_the_physical_block() {
        let g = MemoryBackend::new("S", 512, 1000)
            .with_physical_block_size(4096)
            .geometry();
        let bl = inquiry(&g, true, 0xb0).unwrap();
        assert_eq!(&bl[6..8], [0, 8], "optimal transfer length granularity");
        assert_eq!(
            crate::wire::be32(&bl[28..32]),
            8,
            "optimal unmap granularity"
        );
        assert_eq!(
            crate::wire::be32(&bl[32..36]),
            0x8000_0000,
            "UGAVALID, alignment 0"
        );
    }
}
