//! MODE SENSE and MODE SELECT (SPC-4 §7.5) with the Caching (0x08) and Control (0x0A) pages.
//!
//! No parameter is changeable: every write is durable on return, so the write cache is
//! reported disabled (WCE=0) and cannot be enabled. MODE SELECT accepts a parameter list
//! that restates the current values and refuses any change.

use crate::backend::Geometry;
use crate::cdb::Cdb;
use crate::sense::{Asc, Sense, SenseKey};
use crate::wire::{be16, put_be};

const CACHING: u8 = 0x08;
const CONTROL: u8 = 0x0a;
const ALL_PAGES: u8 = 0x3f;

fn caching_page(changeable: bool) -> Vec<u8> {
    let mut p = vec![0u8; 20];
    p[0] = CACHING;
    p[1] = 18;
    if !changeable {
        // WCE=0 (byte 2 bit 2), RCD=0: reads may be cached, writes are write-through.
        p[2] = 0x00;
    }
    p
}

fn control_page(changeable: bool) -> Vec<u8> {
    let mut p = vec![0u8; 12];
    p[0] = CONTROL;
    p[1] = 10;
    if !changeable {
        p[3] = 0x10; // QUEUE ALGORITHM MODIFIER 1: unrestricted reordering
        put_be(&mut p[8..10], 0xffff); // busy timeout period: unlimited
    }
    p
}

fn pages(page: u8, changeable: bool) -> Result<Vec<u8>, Sense> {
    match page {
        CACHING => Ok(caching_page(changeable)),
        CONTROL => Ok(control_page(changeable)),
        ALL_PAGES => {
            let mut all = caching_page(changeable);
            all.extend(control_page(changeable));
            Ok(all)
        }
        _ => Err(Sense::invalid_field_in_cdb(2)),
    }
}

fn block_descriptor(g: &Geometry, long: bool) -> Vec<u8> {
    if long {
        let mut d = vec![0u8; 16];
        put_be(&mut d[0..8], g.block_count);
        put_be(&mut d[12..16], u64::from(g.block_size));
        return d;
    }
    let mut d = vec![0u8; 8];
    put_be(&mut d[0..4], g.block_count.min(0xffff_ffff));
    put_be(&mut d[5..8], u64::from(g.block_size));
    d
}

/// Builds MODE SENSE(6)/(10) data for a decoded [`Cdb::ModeSense`].
pub fn sense(g: &Geometry, cdb: &Cdb) -> Result<Vec<u8>, Sense> {
    let Cdb::ModeSense {
        ten,
        dbd,
        llbaa,
        pc,
        page,
        subpage,
        alloc,
    } = *cdb
    else {
        return Err(Sense::invalid_opcode());
    };
    if pc == 3 {
        return Err(Sense::new(
            SenseKey::IllegalRequest,
            Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
        ));
    }
    if subpage != 0 && !(subpage == 0xff && page == ALL_PAGES) {
        return Err(Sense::invalid_field_in_cdb(3));
    }
    let body = pages(page, pc == 1)?;
    let desc = if dbd {
        Vec::new()
    } else {
        block_descriptor(g, ten && llbaa)
    };
    // Device-specific parameter: WP (0x80) and DPOFUA (0x10).
    let dsp = 0x10 | if g.read_only { 0x80 } else { 0 };
    let mut out = if ten {
        let mut h = vec![0u8; 8];
        h[3] = dsp;
        h[4] = u8::from(llbaa && !dbd);
        put_be(&mut h[6..8], desc.len() as u64);
        h
    } else {
        vec![0, 0, dsp, desc.len() as u8]
    };
    out.extend(desc);
    out.extend(body);
    if ten {
        let len = out.len() - 2;
        put_be(&mut out[0..2], len as u64);
    } else {
        out[0] = (out.len() - 1).min(255) as u8;
    }
    out.truncate(alloc as usize);
    Ok(out)
}

/// Checks a MODE SELECT parameter list: it may only restate current values.
pub fn select(
    _g: &Geometry,
    ten: bool,
    pf: bool,
    save: bool,
    params: &[u8],
) -> Result<Vec<u8>, Sense> {
    if save {
        return Err(Sense::new(
            SenseKey::IllegalRequest,
            Asc::SAVING_PARAMETERS_NOT_SUPPORTED,
        ));
    }
    if params.is_empty() {
        return Ok(Vec::new());
    }
    if !pf {
        return Err(Sense::invalid_field_in_cdb(1));
    }
    let header = if ten { 8 } else { 4 };
    let Some(head) = params.get(..header) else {
        return Err(Sense::parameter_list_length());
    };
    let desc_len = if ten {
        usize::from(be16(&head[6..8]))
    } else {
        usize::from(head[3])
    };
    let mut rest = params
        .get(header + desc_len..)
        .ok_or(Sense::parameter_list_length())?;
    let mut offset = header + desc_len;
    while !rest.is_empty() {
        let (code, len) = match rest {
            [code, len, ..] => (*code & 0x3f, usize::from(*len) + 2),
            _ => return Err(Sense::parameter_list_length()),
        };
        let Some(page) = rest.get(..len) else {
            return Err(Sense::parameter_list_length());
        };
        let current =
            pages(code, false).map_err(|_| Sense::invalid_field_in_parameters(offset as u16))?;
        // Byte 0's PS bit is reserved in MODE SELECT; compare the rest.
        if page.len() != current.len() || page[1..] != current[1..] {
            return Err(Sense::invalid_field_in_parameters(offset as u16));
        }
        offset += len;
        rest = &rest[len..];
    }
    Ok(Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBackend;
    use crate::BlockBackend;

    fn g() -> Geometry {
        MemoryBackend::new("s", 512, 2048).geometry()
    }

    fn ms6(page: u8, pc: u8, dbd: bool) -> Cdb {
        Cdb::ModeSense {
            ten: false,
            dbd,
            llbaa: false,
            pc,
            page,
            subpage: 0,
            alloc: 255,
        }
    }

    #[test]
    fn mode_sense_6_all_pages() {
        let d = sense(&g(), &ms6(ALL_PAGES, 0, false)).unwrap();
        assert_eq!(d[0] as usize, d.len() - 1);
        assert_eq!(d[3], 8);
        assert_eq!(d[4 + 8], CACHING);
        assert_eq!(d[4 + 8 + 20], CONTROL);
    }

    #[test]
    fn mode_sense_10_long_lba() {
        let cdb = Cdb::ModeSense {
            ten: true,
            dbd: false,
            llbaa: true,
            pc: 0,
            page: CACHING,
            subpage: 0,
            alloc: 1000,
        };
        let d = sense(&g(), &cdb).unwrap();
        assert_eq!(d[4], 1);
        assert_eq!(be16(&d[6..8]), 16);
        assert_eq!(d[8 + 16], CACHING);
    }

    #[test]
    fn saved_values_and_unknown_pages_fail() {
        let e = sense(&g(), &ms6(CACHING, 3, true)).unwrap_err();
        assert_eq!(e.asc, Asc::SAVING_PARAMETERS_NOT_SUPPORTED);
        assert_eq!(
            sense(&g(), &ms6(0x19, 0, true)).unwrap_err().asc,
            Asc::INVALID_FIELD_IN_CDB
        );
    }

    #[test]
    fn select_accepts_current_refuses_change() {
        let mut params = vec![0, 0, 0, 0];
        params.extend(caching_page(false));
        assert!(select(&g(), false, true, false, &params).is_ok());
        params[4 + 2] = 0x04; // WCE=1
        let e = select(&g(), false, true, false, &params).unwrap_err();
        assert_eq!(e.asc, Asc::INVALID_FIELD_IN_PARAMETER_LIST);
        assert!(select(&g(), false, true, false, &params[..5]).is_err());
    }
}
