# The peers of bench/nbd-compare.sh: how each one is started, reached, made durable in place and
# stopped. Sourced by it; uses its settings (SCRATCH, WS_MIB, NBDKIT_PORT, LOG_ARGS, PREV_BIN).
#   mariner : this checkout's `mariner serve` (target/release/mariner)
#   prev    : the previous release's `mariner serve` (build_prev in bench/lib.sh), same flags
#   nbdkit  : nbdkit file plugin + fua filter, fuamode=force (an fdatasync after every write)
#   memory  : nbdkit memory plugin (the protocol's round trip with no disk behind it)
#   raw     : fio straight on a file of the same file system (no server)
# Globals set by start_peer: PEER, SPID (the server's pid, for its CPU ticks; empty for raw),
# URL (its NBD URI), FIO_T (fio's target options), ISCSI_URL (Mariner peers with iSCSI on).

SPID=""; PEER=""; URL=""; FIO_T=""; ISCSI_URL=""; NPID=""; MPID=""

mdir() { echo "$SCRATCH/nc-$1"; }

# start_peer PEER [SIZE_MIB]: a new server of SIZE_MIB (WS_MIB) on a new sparse file (Mariner:
# a new data dir, its volume vol0 of that size, NBD and iSCSI each on a free port).
start_peer() {
  local p=$1 mib=${2:-$WS_MIB} bin
  PEER=$p; ISCSI_URL=""
  case $p in
    mariner | prev)
      bin=$MARINER; [ "$p" = prev ] && bin=$PREV_BIN
      # iSCSI on a free port always: its default port (3260) may be taken on a shared machine.
      MARINER=$bin start_mariner "$(mdir "$p")" --default-volume-size "${mib}MiB" \
        --iscsi-listen 127.0.0.1:0 ${LOG_ARGS[@]+"${LOG_ARGS[@]}"}
      SPID=$MPID; URL=$MURL; FIO_T="--ioengine=nbd --uri=$URL"
      ISCSI_URL="iscsi://$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))['iscsi'][0])" \
        "$(mdir "$p")/data/ports.json")/iqn.2026-11.dev.mariner:vol0/0"
      ;;
    nbdkit | memory)
      if [ "$p" = nbdkit ]; then
        rm -f "$SCRATCH/nc-nbdkit.img"; truncate -s "${mib}M" "$SCRATCH/nc-nbdkit.img"
        nbdkit --exit-with-parent -f --port="$NBDKIT_PORT" --filter=fua \
          file "$SCRATCH/nc-nbdkit.img" fuamode=force &
      else
        nbdkit --exit-with-parent -f --port="$NBDKIT_PORT" memory size="${mib}M" &
      fi
      NPID=$!; SPID=$NPID
      URL="nbd://127.0.0.1:$NBDKIT_PORT"; FIO_T="--ioengine=nbd --uri=$URL"
      for _ in $(seq 1 100); do nbdinfo --size "$URL" >/dev/null 2>&1 && return 0; sleep 0.05; done
      echo "nbdkit ($p) did not start" >&2; return 1
      ;;
    raw)
      rm -f "$SCRATCH/nc-raw.img"; truncate -s "${mib}M" "$SCRATCH/nc-raw.img"
      SPID=""; URL=""; FIO_T="--filename=$SCRATCH/nc-raw.img"
      ;;
  esac
}

stop_peer() {
  case $PEER in
    mariner | prev) stop_mariner; MPID="" ;;
    nbdkit | memory) kill "$NPID" 2>/dev/null || true; wait "$NPID" 2>/dev/null || true; NPID="" ;;
  esac
  SPID=""; PEER=""
}

# durable_in_place: untimed; Mariner until its images hold every durable record (written back;
# prints the seconds), nbdkit file and raw: fsync of the file (prints 0).
durable_in_place() {
  case $PEER in
    mariner | prev) wait_written_back "$(mdir "$PEER")" "${WB_TIMEOUT:-300}" ;;
    nbdkit) sync -d "$SCRATCH/nc-nbdkit.img"; echo 0 ;;
    raw) sync -d "$SCRATCH/nc-raw.img"; echo 0 ;;
    *) echo 0 ;;
  esac
}

# fill [SIZE_MIB]: untimed; the whole volume written once sequentially through the peer (1 MiB
# writes, depth 8), then durable in place, so no peer starts on a sparse file or a full log.
fill() {
  local mib=${1:-$WS_MIB} eng=()
  [ "$PEER" = raw ] && eng=(--ioengine=libaio --direct=1)
  timeout "${FIO_TIMEOUT:-600}" fio --name=fill $FIO_T ${eng[@]+"${eng[@]}"} --size="${mib}M" \
    --rw=write --bs=1M --iodepth=8 --output-format=terse >/dev/null
  durable_in_place >/dev/null
}

# warm: durable in place, then the whole working set read once sequentially through the peer
# (raw: buffered), so the page cache holds it for every peer alike.
warm() {
  durable_in_place >/dev/null
  timeout "${FIO_TIMEOUT:-600}" fio --name=warm $FIO_T --size="${WS_MIB}M" --rw=read --bs=1M \
    --iodepth=8 --output-format=terse >/dev/null
}

cleanup_peers() {
  [ -n "$MPID" ] && { stop_mariner; MPID=""; }
  if [ -n "$NPID" ]; then kill "$NPID" 2>/dev/null || true; wait "$NPID" 2>/dev/null || true; NPID=""; fi
  if [ -n "${FUSE_MNT:-}" ] && mountpoint -q "$FUSE_MNT" 2>/dev/null; then fusermount3 -u "$FUSE_MNT" || true; fi
  rm -rf "$(mdir mariner)" "$(mdir prev)" "$SCRATCH/nc-nbdkit.img" "$SCRATCH/nc-raw.img" \
    "$SCRATCH/nc-sparse.img" "$SCRATCH/nc-fuse"
}
