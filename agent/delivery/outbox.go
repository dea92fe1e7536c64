package delivery

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"hvguard/daemonkit/atomicfile"
	"hvguard/proto"
)

// Outbox bounds and timings.
const (
	// DefaultMaxBytes bounds the bytes of unacked records (~180 000 events of
	// ~350 bytes): hours of a busy host's events while NATS is unreachable,
	// and a small fraction of a compute node's state disk.
	DefaultMaxBytes = 64 << 20
	// DefaultMaxEvents bounds the number of unacked records, and with it the
	// in-memory index (~40 bytes per record) and the replay time on start.
	DefaultMaxEvents = 100000
	// DefaultSegmentBytes is the size at which a segment file is sealed and a
	// new one started. Disk use is at most MaxBytes plus one segment (a
	// segment is deleted only when all its records are acked); 4 MiB keeps
	// that overshoot small and the number of files low (16 at MaxBytes).
	DefaultSegmentBytes = 4 << 20
	// SyncDelay is the longest an appended record waits before it is
	// fsynced (group commit). Records are written (write(2)) at once, so a
	// process crash loses nothing; SyncDelay only bounds what a power loss
	// can take. The publisher sends only fsynced records (see doc.go), so
	// it also adds at most SyncDelay to delivery latency: 10 ms is invisible
	// next to libvirt event latency and the controller's decision windows
	// (seconds), and caps fsyncs at 100/s, which any disk sustains.
	SyncDelay = 10 * time.Millisecond
	// StatePersistInterval is how often the ack cursor is persisted when it
	// changed. A lagging cursor only means re-sends after a restart, which
	// JetStream dedups; persisting it is 3 fsyncs, so not on every ack.
	StatePersistInterval = time.Second
	// ResumeFraction is the hysteresis of a full outbox: after it drops
	// events, it accepts events again (starting with a gap marker) only once
	// it is below this fraction of both bounds, so a slowly draining outbox
	// does not alternate drop/accept and emit a gap marker (and an ERROR
	// log) per event.
	ResumeFraction = 0.9
)

// ErrFull is returned (wrapped) by Append when the outbox is full and the
// event was dropped. The drop is accounted for: the event's Seq is consumed
// and a gap marker covering it is appended once space frees. Do not retry
// the event; the consumer learns from the gap marker that it must resync.
var ErrFull = errors.New("outbox full: event dropped")

// ErrClosed is returned by operations on a closed Outbox.
var ErrClosed = errors.New("outbox closed")

const (
	stateFileName = "state.json"
	lockFileName  = "lock"
	segSuffix     = ".seg"
	// recordHeaderSize: payload length (4) + CRC32-C (4) + seq (8).
	recordHeaderSize = 16
	// GapReason is the Reason of gap markers appended by the outbox.
	GapReason = "outbox-full"
	// dropSeqReserve: while dropping, the state is persisted once per this
	// many drops (not per drop: a drop burst must not become an fsync
	// storm), reserving the seqs up to the next persist. After a crash in a
	// drop burst the gap therefore covers up to this many seqs that were
	// never assigned, which is harmless (the consumer resyncs on any gap)
	// and keeps seqs from ever being reused.
	dropSeqReserve = 1024
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// OutboxConfig configures an Outbox. Zero values mean the defaults.
type OutboxConfig struct {
	// Host is the compute host's name; every event appended must be for it
	// (an empty Host in an event is filled in).
	Host string
	// MaxBytes bounds the bytes (headers included) of unacked records.
	MaxBytes int64
	// MaxEvents bounds the number of unacked records.
	MaxEvents int
	// SegmentBytes is the size at which a segment is sealed.
	SegmentBytes int64
	// Now is the clock for gap markers' observed_at (default time.Now).
	Now func() time.Time
}

// Outbox is a bounded, durable, append-only queue of one host's lifecycle
// events in its own directory. See the package doc for the on-disk format
// and invariants. It is safe for concurrent use.
type Outbox struct {
	dir string
	cfg OutboxConfig
	log *slog.Logger
	// inc is the outbox's incarnation (see proto.Incarnation), fixed when
	// the outbox is created: set by load, never changed after.
	inc proto.Incarnation

	lock *os.File // holds the directory's flock (lockDir)

	syncMu sync.Mutex // serialises Sync

	mu           sync.Mutex
	segs         []*segment // by first seq; the last one is the active one
	pending      []entry    // unacked records in seq order
	pendingBytes int64
	nextSeq      uint64 // next seq to assign
	lastRecord   uint64 // seq of the last record written
	synced       uint64 // every record <= synced is fsynced
	acked        uint64 // every record <= acked is acked
	gap          *gapState
	stateDirty   bool
	closing      bool // Close is writing the last state (outboxState.Clean)
	stateWritten time.Time
	changed      chan struct{} // closed and replaced on every change
	closed       bool
	buf          []byte
	st           outboxCounters

	appendNotify chan struct{}
	stop         chan struct{}
	done         chan struct{}
}

type segment struct {
	f     *os.File
	path  string
	base  uint64 // the seq in its file name: that of its first record
	first uint64 // seq of the first record (0: none yet)
	last  uint64 // seq of the last record
	size  int64
}

type entry struct {
	seq uint64
	seg *segment
	off int64  // offset of the payload
	n   uint32 // payload length
}

type gapState struct {
	First      uint64    `json:"first"`
	Last       uint64    `json:"last"`
	Count      uint64    `json:"count"`
	OccurredAt time.Time `json:"occurred_at"`
	// Reserved: drops may have consumed seqs up to Reserved (> Last) since
	// the state was persisted; see dropSeqReserve.
	Reserved uint64 `json:"reserved,omitempty"`
}

// outboxState is persisted in state.json (write tmp, fsync, rename).
type outboxState struct {
	// Incarnation: drawn when the outbox was created; 0 (absent) for an outbox
	// created by an agent from before incarnations (kept so: its seqs
	// continue, and so do its Msg-Ids).
	Incarnation proto.Incarnation `json:"incarnation,omitempty"`
	// Acked: every record <= Acked has been acked.
	Acked uint64 `json:"acked"`
	// LastSeq: the highest seq assigned (to a record or a dropped event).
	LastSeq uint64 `json:"last_seq"`
	// Gap: dropped events not yet covered by a gap marker.
	Gap *gapState `json:"gap,omitempty"`
	// Active is the base seq of the active (newest) segment when the state
	// was written, persisted as soon as a segment is created; ActiveLimit
	// bounds the seqs records written before the next state write can have
	// (see writeStateLocked). Clean: written by Close (LastSeq is then exact).
	// While the agent runs LastSeq lags the records (it is persisted at
	// most every StatePersistInterval) and records above it are published:
	// if the active segment is missing at the next start after an unclean
	// stop, those seqs are unknown and must not be assigned again (their
	// Msg-Ids are in JetStream's duplicate window, their seqs in the
	// consumers' cursors): the outbox continues above ActiveLimit (a seq
	// hole: consumers resync this host).
	Active      uint64 `json:"active_segment,omitempty"`
	ActiveLimit uint64 `json:"active_segment_limit,omitempty"`
	Clean       bool   `json:"clean,omitempty"`
}

type outboxCounters struct {
	appended, acked, dropped, gapMarkers, corrupt uint64
	lastErr                                       string
	lastErrAt                                     time.Time
}

type record struct {
	Seq  uint64
	Data []byte
}

// OpenOutbox opens (creating it if needed) the outbox in dir, its own
// directory inside the agent's state directory (e.g. <state_dir>/outbox;
// nothing else may write there), replays its unacked records (truncating a
// torn tail, skipping corrupt records loudly), and starts its background
// syncer. Close it when done.
func OpenOutbox(dir string, cfg OutboxConfig, log *slog.Logger) (*Outbox, error) {
	if _, err := proto.HostToken(cfg.Host); err != nil {
		return nil, fmt.Errorf("open outbox: %w", err)
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.SegmentBytes <= 0 {
		cfg.SegmentBytes = DefaultSegmentBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("open outbox: %w", err)
	}
	o := &Outbox{
		dir: dir, cfg: cfg, log: log.With("component", "outbox", "host", cfg.Host),
		changed:      make(chan struct{}),
		appendNotify: make(chan struct{}, 1),
		stop:         make(chan struct{}),
		done:         make(chan struct{}),
	}
	if err := o.lockDir(); err != nil {
		return nil, fmt.Errorf("open outbox %s: %w", dir, err)
	}
	if err := o.load(); err != nil {
		o.closeFiles()
		return nil, fmt.Errorf("open outbox %s: %w", dir, err)
	}
	go o.syncer()
	return o, nil
}

// lockDir takes an exclusive flock(2) on the directory's lock file, held
// until Close (the kernel drops it when the process dies, SIGKILL too).
// Two processes on one outbox would assign the same seqs to different
// events under the same incarnation, and JetStream would keep only one of
// each pair (same Msg-Id): a second agent on the same state_dir is refused.
func (o *Outbox) lockDir() error {
	f, err := LockFile(filepath.Join(o.dir, lockFileName))
	if errors.Is(err, ErrLocked) {
		return fmt.Errorf("%w (another hvguard-agent with this state_dir?): two agents on one outbox would reuse each other's seqs", err)
	}
	if err != nil {
		return err
	}
	o.lock = f
	return nil
}

// ErrLocked: LockFile found the lock held by another process.
var ErrLocked = errors.New("in use by another process")

// LockFile opens (creating it) path and takes an exclusive flock(2) on it
// without waiting: held until the file is closed, or the process dies
// (SIGKILL too). The agent's state_dir lock and the outbox's use it.
func LockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, ErrLocked
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	return f, nil
}

// load reads state.json and the segments. Called once, before any other use.
func (o *Outbox) load() error {
	var st outboxState
	b, err := os.ReadFile(filepath.Join(o.dir, stateFileName))
	haveState := err == nil
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &st); err != nil {
			// state.json is only ever replaced by rename, so this is disk
			// corruption; guessing the last seq could reuse seqs.
			return fmt.Errorf("corrupt %s (remove the outbox directory to start over: the new outbox is a new incarnation, consumers resync this host): %w", stateFileName, err)
		}
	}
	// Temporary files of a write a crash cut short (the name releases
	// before atomicfile used, and atomicfile's): never read, removed.
	_ = os.Remove(filepath.Join(o.dir, stateFileName+".tmp"))
	_, _ = atomicfile.RemoveTemps(o.dir)
	o.acked = st.Acked

	des, err := os.ReadDir(o.dir)
	if err != nil {
		return err
	}
	var names []string
	for _, de := range des {
		if strings.HasSuffix(de.Name(), segSuffix) {
			names = append(names, de.Name())
		}
	}
	slices.Sort(names) // zero-padded first seq: lexical = numeric order
	var maxSeq uint64
	for i, name := range names {
		seg, err := o.loadSegment(filepath.Join(o.dir, name), i == len(names)-1, &maxSeq)
		if err != nil {
			return err
		}
		seg.base, _ = strconv.ParseUint(strings.TrimSuffix(name, segSuffix), 10, 64)
		o.segs = append(o.segs, seg)
	}
	o.lastRecord = maxSeq
	o.synced = maxSeq
	o.nextSeq = max(st.LastSeq, st.Acked, maxSeq) + 1
	if g := st.Gap; g != nil && g.Last >= maxSeq && g.Last > st.Acked {
		// Events were dropped and no record (hence no gap marker) followed.
		// After a crash, drops may have used seqs up to g.Reserved.
		if g.Reserved > g.Last {
			g.Last = g.Reserved
			g.Count = g.Last - g.First + 1
		}
		g.Reserved = 0
		o.gap = g
		o.nextSeq = max(o.nextSeq, g.Last+1)
	}
	if haveState && !st.Clean && st.Active != 0 && (len(o.segs) == 0 || o.segs[len(o.segs)-1].base < st.Active) {
		// The agent stopped uncleanly and the segment it was writing is
		// gone: its published seqs above LastSeq are unknown.
		o.log.Error("OUTBOX SEGMENTS MISSING after an unclean stop: records may be lost; continuing above every seq the lost segment could hold, so none is reused (consumers see a seq hole and resync this host)",
			"active_segment", st.Active, "last_seq_persisted", st.LastSeq, "next_seq", max(o.nextSeq, st.ActiveLimit+1))
		o.nextSeq = max(o.nextSeq, st.ActiveLimit+1)
	}
	if err := o.loadIncarnation(st, haveState); err != nil {
		return err
	}
	if n := len(o.pending); n > 0 {
		o.log.Info("outbox replaying unacked events", "events", n, "bytes", o.pendingBytes,
			"first_seq", o.pending[0].seq, "last_seq", o.pending[n-1].seq)
	}
	o.stateDirty = true
	if err := o.persistLocked(); err != nil {
		return err
	}
	return nil
}

// loadIncarnation sets o.inc once the state and the segments are loaded:
// the state's; without a state file, that of the last record (a state file
// lost while records remain); with neither, the outbox is new (or its
// seqs start again at 1 anyway): a new incarnation.
func (o *Outbox) loadIncarnation(st outboxState, haveState bool) error {
	switch n := len(o.pending); {
	case haveState && (st.Incarnation != 0 || len(o.pending) > 0):
		o.inc = st.Incarnation
		if o.inc == 0 {
			o.log.Warn("outbox created before incarnations, with unacked events: they and the events after them keep Msg-Ids <host>:<seq> (predictable: another host could pre-empt them) until a start finds none unacked",
				"unacked", len(o.pending))
		}
		return nil
	case haveState:
		// Created before incarnations, nothing unacked: a new incarnation
		// from now on. Its Msg-Ids <host>:<seq> were predictable, and
		// JetStream deduplicates Msg-Ids stream-wide: another host
		// publishing those IDs on its own subject had this host's next
		// events acked as duplicates and never stored (reviewer X17,
		// TestX17PreemptedLegacyMsgIDNATS). Seqs continue; consumers see
		// a new incarnation and resync this host.
		inc, err := proto.NewIncarnation()
		if err != nil {
			return err
		}
		o.inc = inc
		o.log.Warn("outbox created before incarnations: new incarnation from now on (Msg-Ids <host>:<seq> were predictable); consumers resync this host", "incarnation", inc, "next_seq", o.nextSeq)
		return nil
	case n > 0:
		e := o.pending[n-1]
		data := make([]byte, e.n)
		if _, err := e.seg.f.ReadAt(data, e.off); err != nil {
			return fmt.Errorf("read the incarnation of seq %d: %w", e.seq, err)
		}
		var rec struct {
			Incarnation proto.Incarnation `json:"incarnation"`
		}
		if err := json.Unmarshal(data, &rec); err != nil {
			return fmt.Errorf("read the incarnation of seq %d: %w", e.seq, err)
		}
		o.inc = rec.Incarnation
		o.log.Warn("outbox state file missing; incarnation and seqs taken from the records", "incarnation", o.inc, "last_seq", e.seq)
		return nil
	}
	inc, err := proto.NewIncarnation()
	if err != nil {
		return err
	}
	o.inc = inc
	o.log.Info("new outbox: new incarnation; seqs start at 1 and consumers resync this host", "incarnation", inc, "first_seq", o.nextSeq)
	return nil
}

// loadSegment scans one segment file, appending its unacked records to
// o.pending. A bad record followed by a good one is corruption in the
// middle: logged at ERROR and skipped. A bad record not followed by a good
// one is a torn tail (a write cut short by a crash): truncated, logged at
// WARN in the active (last) segment, at ERROR in a sealed one.
func (o *Outbox) loadSegment(path string, last bool, maxSeq *uint64) (*segment, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	flag := os.O_RDONLY
	if last {
		flag = os.O_RDWR | os.O_APPEND
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, err
	}
	seg := &segment{f: f, path: path}
	off := 0
	for off < len(data) {
		seq, n, ok := parseRecord(data[off:], *maxSeq)
		if ok {
			if seq > o.acked {
				o.pending = append(o.pending, entry{seq: seq, seg: seg, off: int64(off + recordHeaderSize), n: uint32(n)})
				o.pendingBytes += int64(recordHeaderSize + n)
			}
			if seg.first == 0 {
				seg.first = seq
			}
			seg.last = seq
			*maxSeq = seq
			off += recordHeaderSize + n
			continue
		}
		if n > 0 && off+recordHeaderSize+n < len(data) {
			if _, _, next := parseRecord(data[off+recordHeaderSize+n:], *maxSeq); next {
				o.st.corrupt++
				o.log.Error("outbox: CORRUPT RECORD SKIPPED; its event is lost and shows as a seq hole to the consumer",
					"file", path, "offset", off, "bytes", recordHeaderSize+n)
				off += recordHeaderSize + n
				continue
			}
		}
		lvl := slog.LevelWarn
		msg := "outbox: torn tail truncated (write cut short by a crash; never published)"
		if !last {
			lvl = slog.LevelError
			msg = "outbox: CORRUPT END OF SEALED SEGMENT truncated; its events are lost"
			o.st.corrupt++
		}
		o.log.Log(context.Background(), lvl, msg, "file", path, "offset", off, "bytes", len(data)-off)
		if err := os.Truncate(path, int64(off)); err != nil {
			f.Close()
			return nil, fmt.Errorf("truncate %s: %w", path, err)
		}
		break
	}
	seg.size = int64(off)
	if err := f.Sync(); err != nil && last {
		f.Close()
		return nil, fmt.Errorf("fsync %s: %w", path, err)
	}
	return seg, nil
}

// parseRecord parses the record at the start of b. n is the payload length
// from the header when the header is complete and plausible (else 0); ok
// reports a complete record with a good CRC and a seq above prev.
func parseRecord(b []byte, prev uint64) (seq uint64, n int, ok bool) {
	if len(b) < recordHeaderSize {
		return 0, 0, false
	}
	n = int(binary.LittleEndian.Uint32(b[0:4]))
	if n == 0 || n > proto.MaxMessageSize {
		return 0, 0, false
	}
	if len(b) < recordHeaderSize+n {
		return 0, n, false
	}
	seq = binary.LittleEndian.Uint64(b[8:16])
	if crc32.Checksum(b[8:recordHeaderSize+n], crcTable) != binary.LittleEndian.Uint32(b[4:8]) || seq <= prev {
		return 0, n, false
	}
	return seq, n, true
}

// Append assigns ev.Seq and ev.Incarnation (and fills ev.Schema and an
// empty ev.Host), and
// writes the event to the outbox. On return without error the event is in
// the page cache (it survives the agent being killed) and will be fsynced
// within SyncDelay (or by Sync).
//
// If the outbox is full the event is dropped: its Seq is still assigned
// (so the consumer sees a hole), the drop is counted and logged, a gap
// marker is appended once space frees, and an error wrapping ErrFull is
// returned. An event that fails validation is rejected without consuming
// a seq.
func (o *Outbox) Append(ev *proto.LifecycleEvent) error {
	if ev.Host == "" {
		ev.Host = o.cfg.Host
	}
	if ev.Host != o.cfg.Host {
		return fmt.Errorf("outbox append: event host %q is not the outbox host %q", ev.Host, o.cfg.Host)
	}
	ev.Schema = proto.SchemaVersion
	ev.Incarnation = o.inc
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return ErrClosed
	}
	ev.Seq = o.nextSeq
	data, err := ev.Encode()
	if err != nil {
		ev.Seq = 0
		return fmt.Errorf("outbox append: %w", err)
	}
	if o.gap != nil {
		if !o.belowResumeLocked(len(data)) {
			o.dropLocked(ev, "full")
			return fmt.Errorf("outbox append seq %d: %w", ev.Seq, ErrFull)
		}
		if err := o.appendGapMarkerLocked(); err != nil {
			o.dropLocked(ev, "gap marker write failed")
			return fmt.Errorf("outbox append seq %d: %w", ev.Seq, err)
		}
		ev.Seq = o.nextSeq
		if data, err = ev.Encode(); err != nil {
			return fmt.Errorf("outbox append: %w", err)
		}
	}
	if !o.fitsLocked(len(data)) {
		o.dropLocked(ev, "full")
		return fmt.Errorf("outbox append seq %d: %w", ev.Seq, ErrFull)
	}
	if err := o.writeLocked(ev.Seq, data); err != nil {
		o.dropLocked(ev, "write failed")
		return fmt.Errorf("outbox append seq %d: %w", ev.Seq, err)
	}
	o.st.appended++
	return nil
}

func (o *Outbox) fitsLocked(n int) bool {
	return len(o.pending)+1 <= o.cfg.MaxEvents &&
		o.pendingBytes+int64(recordHeaderSize+n) <= o.cfg.MaxBytes
}

// belowResumeLocked reports whether a gap marker and an event of n bytes
// fit below ResumeFraction of the bounds.
func (o *Outbox) belowResumeLocked(n int) bool {
	const markerBytes = 512 // generous upper bound of an encoded gap marker
	return float64(len(o.pending)+2) <= ResumeFraction*float64(o.cfg.MaxEvents) &&
		float64(o.pendingBytes+int64(2*recordHeaderSize+n+markerBytes)) <= ResumeFraction*float64(o.cfg.MaxBytes)
}

// dropLocked accounts for an event that could not be stored: its seq is
// consumed and added to the pending gap.
func (o *Outbox) dropLocked(ev *proto.LifecycleEvent, why string) {
	ev.Seq = o.nextSeq
	o.nextSeq++
	o.st.dropped++
	o.stateDirty = true
	if o.gap != nil {
		o.gap.Last = ev.Seq
		o.gap.Count++
		if ev.Seq > o.gap.Reserved {
			o.gap.Reserved = ev.Seq + dropSeqReserve
			if err := o.writeStateLocked(); err != nil {
				o.log.Error("outbox: persisting gap state failed", "err", err)
			}
		}
		return
	}
	at := ev.OccurredAt
	if at.IsZero() {
		at = o.cfg.Now()
	}
	o.gap = &gapState{First: ev.Seq, Last: ev.Seq, Count: 1, OccurredAt: at.UTC(), Reserved: ev.Seq + dropSeqReserve}
	o.setErrLocked(fmt.Sprintf("outbox %s: dropping events from seq %d", why, ev.Seq))
	o.log.Error("OUTBOX FULL: DROPPING LIFECYCLE EVENTS; a gap marker will follow and the controller must resync this host",
		"why", why, "first_dropped_seq", ev.Seq, "depth", len(o.pending), "bytes", o.pendingBytes,
		"max_events", o.cfg.MaxEvents, "max_bytes", o.cfg.MaxBytes, "dropped_total", o.st.dropped)
	// Persist the start of the gap now, so that a restart cannot forget it.
	if err := o.writeStateLocked(); err != nil {
		o.log.Error("outbox: persisting gap state failed", "err", err)
	}
}

// appendGapMarkerLocked writes the marker for the pending gap.
func (o *Outbox) appendGapMarkerLocked() error {
	g := o.gap
	m := proto.LifecycleEvent{
		Schema: proto.SchemaVersion, Host: o.cfg.Host, Incarnation: o.inc, Seq: o.nextSeq,
		Transition: proto.TransitionGap, Reason: GapReason,
		OccurredAt: g.OccurredAt, ObservedAt: o.cfg.Now().UTC(),
		GapFirstSeq: g.First, GapLastSeq: g.Last, GapCount: g.Count,
	}
	data, err := m.Encode()
	if err != nil {
		return fmt.Errorf("gap marker: %w", err)
	}
	if err := o.writeLocked(m.Seq, data); err != nil {
		return fmt.Errorf("gap marker: %w", err)
	}
	o.gap = nil
	o.st.gapMarkers++
	o.log.Error("outbox accepting events again; gap marker appended",
		"dropped", g.Count, "first_dropped_seq", g.First, "last_dropped_seq", g.Last,
		"marker_seq", m.Seq, "depth", len(o.pending), "dropped_total", o.st.dropped)
	o.stateDirty = true
	if err := o.writeStateLocked(); err != nil {
		o.log.Error("outbox: persisting state after gap marker failed", "err", err)
	}
	return nil
}

// writeLocked writes one record with a single write(2) and indexes it.
// seq must be o.nextSeq. On failure nothing is indexed and the segment is
// truncated back.
func (o *Outbox) writeLocked(seq uint64, data []byte) error {
	recLen := int64(recordHeaderSize + len(data))
	seg, err := o.activeLocked(seq, recLen)
	if err != nil {
		o.setErrLocked(err.Error())
		return err
	}
	o.buf = slices.Grow(o.buf[:0], int(recLen))[:recordHeaderSize]
	binary.LittleEndian.PutUint32(o.buf[0:4], uint32(len(data)))
	binary.LittleEndian.PutUint64(o.buf[8:16], seq)
	o.buf = append(o.buf, data...)
	binary.LittleEndian.PutUint32(o.buf[4:8], crc32.Checksum(o.buf[8:], crcTable))
	if _, err := seg.f.Write(o.buf); err != nil {
		if terr := seg.f.Truncate(seg.size); terr != nil {
			err = errors.Join(err, fmt.Errorf("truncating back: %w", terr))
		}
		o.setErrLocked(err.Error())
		return fmt.Errorf("write %s: %w", seg.path, err)
	}
	o.pending = append(o.pending, entry{seq: seq, seg: seg, off: seg.size + recordHeaderSize, n: uint32(len(data))})
	o.pendingBytes += recLen
	seg.size += recLen
	if seg.first == 0 {
		seg.first = seq
	}
	seg.last = seq
	o.lastRecord = seq
	o.nextSeq = seq + 1
	o.notifyLocked()
	select {
	case o.appendNotify <- struct{}{}:
	default:
	}
	return nil
}

// activeLocked returns the segment to append a record of recLen bytes to,
// sealing the active one (fsync) and creating a new one when needed.
func (o *Outbox) activeLocked(seq uint64, recLen int64) (*segment, error) {
	if n := len(o.segs); n > 0 {
		cur := o.segs[n-1]
		if cur.size == 0 || cur.size+recLen <= o.cfg.SegmentBytes {
			return cur, nil
		}
		if err := cur.f.Sync(); err != nil {
			return nil, fmt.Errorf("fsync sealed segment %s: %w", cur.path, err)
		}
	}
	path := filepath.Join(o.dir, fmt.Sprintf("%020d%s", seq, segSuffix))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("create segment: %w", err)
	}
	if err := atomicfile.SyncDir(o.dir); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	seg := &segment{f: f, path: path, base: seq}
	o.segs = append(o.segs, seg)
	// Persist the new active segment before any of its records can be
	// published (see outboxState.Active).
	if err := o.writeStateLocked(); err != nil {
		o.segs = o.segs[:len(o.segs)-1]
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return seg, nil
}

// Sync fsyncs everything appended so far, then persists the ack cursor
// (if due) and deletes fully acked sealed segments. It is called every
// SyncDelay after an append by the outbox itself; call it on shutdown or
// whenever durability is wanted now.
func (o *Outbox) Sync() error {
	o.syncMu.Lock()
	defer o.syncMu.Unlock()
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return ErrClosed
	}
	target := o.lastRecord
	var f *os.File
	if n := len(o.segs); n > 0 && target > o.synced {
		f = o.segs[n-1].f
	}
	o.mu.Unlock()
	// fsync outside o.mu so appends continue meanwhile. If the segment was
	// sealed (fsynced) or deleted (fully acked) concurrently, ErrClosed
	// means its records are durable or no longer needed.
	if f != nil {
		if err := f.Sync(); err != nil && !errors.Is(err, os.ErrClosed) {
			o.mu.Lock()
			o.setErrLocked("fsync: " + err.Error())
			o.mu.Unlock()
			return fmt.Errorf("outbox sync: %w", err)
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if target > o.synced {
		o.synced = target
		o.notifyLocked()
	}
	if err := o.persistLocked(); err != nil {
		return fmt.Errorf("outbox sync: %w", err)
	}
	return nil
}

// persistLocked writes state.json if it is due (dirty and either the
// interval passed or sealed segments can be deleted), then deletes the
// fully acked sealed segments. The state is written first: it records the
// last seq, which must not be forgotten when segments disappear.
func (o *Outbox) persistLocked() error {
	compact := len(o.segs) > 1 && o.segs[0].last <= o.acked
	if !o.stateDirty || (!compact && o.cfg.Now().Sub(o.stateWritten) < StatePersistInterval) {
		return nil
	}
	if err := o.writeStateLocked(); err != nil {
		return err
	}
	for len(o.segs) > 1 && o.segs[0].last <= o.acked {
		seg := o.segs[0]
		seg.f.Close()
		if err := os.Remove(seg.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			o.setErrLocked(err.Error())
			return fmt.Errorf("delete acked segment: %w", err)
		}
		o.segs = o.segs[1:]
	}
	return nil
}

// writeStateLocked atomically replaces state.json: write tmp, fsync,
// rename, fsync the directory.
func (o *Outbox) writeStateLocked() error {
	st := outboxState{Incarnation: o.inc, Acked: o.acked, LastSeq: o.nextSeq - 1, Gap: o.gap, Clean: o.closing}
	if n := len(o.segs); n > 0 {
		st.Active = o.segs[n-1].base
		// Until the next state write, at most a segment's worth of records
		// (SegmentBytes of records of at least recordHeaderSize+1 bytes;
		// one bigger record alone) can follow: seqs jump otherwise only by
		// drops, and drops and the gap marker after them write the state.
		st.ActiveLimit = o.nextSeq - 1 + uint64(o.cfg.SegmentBytes)/(recordHeaderSize+1) + 1
	}
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	path := filepath.Join(o.dir, stateFileName)
	if err := atomicfile.Write(path, b, 0o600); err != nil {
		o.setErrLocked(err.Error())
		return fmt.Errorf("persist outbox state: %w", err)
	}
	o.stateDirty = false
	o.stateWritten = o.cfg.Now()
	return nil
}

// ack marks every record <= seq as acked (published and stored by
// JetStream). Space freed may let a pending gap marker be appended.
func (o *Outbox) ack(seq uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if seq <= o.acked || o.closed {
		return
	}
	i := sort.Search(len(o.pending), func(i int) bool { return o.pending[i].seq > seq })
	for _, e := range o.pending[:i] {
		o.pendingBytes -= int64(recordHeaderSize + e.n)
	}
	o.st.acked += uint64(i)
	o.pending = o.pending[i:]
	if len(o.pending) == 0 {
		o.pending = nil // let the backing array go
	}
	o.acked = seq
	o.stateDirty = true
	if o.gap != nil && o.belowResumeLocked(0) {
		if err := o.appendGapMarkerLocked(); err != nil {
			o.log.Error("outbox: appending gap marker failed; will retry", "err", err)
		}
	}
	o.notifyLocked()
}

// read returns up to max durable (fsynced) unacked records with seq > after.
func (o *Outbox) read(after uint64, max int) ([]record, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, ErrClosed
	}
	i := sort.Search(len(o.pending), func(i int) bool { return o.pending[i].seq > after })
	var recs []record
	for ; i < len(o.pending) && len(recs) < max; i++ {
		e := o.pending[i]
		if e.seq > o.synced {
			break
		}
		data := make([]byte, e.n)
		if _, err := e.seg.f.ReadAt(data, e.off); err != nil {
			o.setErrLocked(err.Error())
			return recs, fmt.Errorf("outbox read seq %d: %w", e.seq, err)
		}
		recs = append(recs, record{Seq: e.seq, Data: data})
	}
	return recs, nil
}

// Since returns the events of every record the outbox still holds with a
// seq above after, acked or not, in seq order, when they are all of the
// events appended after it: the outbox is incarnation inc and its
// segments reach back to after+1 (the active segment keeps acked records
// until it is sealed or the outbox is closed). ok is false when that
// cannot be shown. The agent folds them into the domain states it saved
// at seq after (KnownSaveInterval): what it reported after its last save
// before a kill.
func (o *Outbox) Since(inc proto.Incarnation, after uint64) (evs []proto.LifecycleEvent, ok bool, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return nil, false, ErrClosed
	}
	if inc != o.inc {
		return nil, false, nil
	}
	if o.nextSeq-1 <= after {
		return nil, true, nil
	}
	first := uint64(0)
	for _, seg := range o.segs {
		if seg.first != 0 {
			first = seg.first
			break
		}
	}
	if first == 0 || first > after+1 {
		return nil, false, nil
	}
	for _, seg := range o.segs {
		if seg.last <= after || seg.size == 0 {
			continue
		}
		data := make([]byte, seg.size)
		if _, err := seg.f.ReadAt(data, 0); err != nil {
			return nil, false, fmt.Errorf("outbox read %s: %w", seg.path, err)
		}
		var prev uint64
		for off := 0; off < len(data); {
			seq, n, good := parseRecord(data[off:], prev)
			if !good {
				if n == 0 {
					break
				}
				off += recordHeaderSize + n // corrupt record (skipped at load too)
				continue
			}
			prev = seq
			if seq > after {
				ev, err := proto.DecodeLifecycle(data[off+recordHeaderSize : off+recordHeaderSize+n])
				if err != nil {
					return nil, false, fmt.Errorf("outbox record %d: %w", seq, err)
				}
				evs = append(evs, ev)
			}
			off += recordHeaderSize + n
		}
	}
	return evs, true, nil
}

// ackedSeq returns the ack cursor: every record <= it is acked.
func (o *Outbox) ackedSeq() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.acked
}

// lastRecordSeq returns the seq of the last record written.
func (o *Outbox) lastRecordSeq() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.lastRecord
}

// unackedUpTo returns how many unacked records have seq <= seq.
func (o *Outbox) unackedUpTo(seq uint64) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return sort.Search(len(o.pending), func(i int) bool { return o.pending[i].seq > seq })
}

// changedCh returns a channel closed at the next append, sync or ack.
func (o *Outbox) changedCh() <-chan struct{} {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.changed
}

func (o *Outbox) notifyLocked() {
	close(o.changed)
	o.changed = make(chan struct{})
}

func (o *Outbox) setErrLocked(msg string) {
	o.st.lastErr = msg
	o.st.lastErrAt = o.cfg.Now()
}

// syncer fsyncs SyncDelay after appends (group commit) and persists the
// ack cursor every StatePersistInterval.
func (o *Outbox) syncer() {
	defer close(o.done)
	tick := time.NewTicker(StatePersistInterval)
	defer tick.Stop()
	delay := time.NewTimer(0)
	<-delay.C
	for {
		select {
		case <-o.stop:
			return
		case <-tick.C:
		case <-o.appendNotify:
			delay.Reset(SyncDelay)
			select {
			case <-o.stop:
				return
			case <-delay.C:
			}
		}
		if err := o.Sync(); err != nil && !errors.Is(err, ErrClosed) {
			o.log.Error("outbox background sync failed", "err", err)
		}
	}
}

// Close stops the syncer, fsyncs, persists the state, deletes the active
// segment if all its records are acked, and closes the files. Unacked
// records stay on disk for the next OpenOutbox.
func (o *Outbox) Close() error {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil
	}
	o.mu.Unlock()
	close(o.stop)
	<-o.done
	err := o.Sync()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.stateDirty = true
	o.closing = true // LastSeq exact: Clean
	if o.gap != nil {
		o.gap.Reserved = 0 // exact: no drops after this write
	}
	if werr := o.writeStateLocked(); werr != nil {
		err = errors.Join(err, werr)
	}
	for _, seg := range o.segs {
		if seg.last <= o.acked && seg.size > 0 || seg.size == 0 {
			seg.f.Close()
			if rerr := os.Remove(seg.path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				err = errors.Join(err, rerr)
			}
		}
	}
	o.closeFiles()
	o.closed = true
	o.notifyLocked()
	return err
}

func (o *Outbox) closeFiles() {
	for _, seg := range o.segs {
		seg.f.Close()
	}
	if o.lock != nil {
		o.lock.Close() // releases the flock
		o.lock = nil
	}
}

// Stats returns the outbox's part of Stats (publisher fields zero).
func (o *Outbox) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	return Stats{
		Appended: o.st.appended, Acked: o.st.acked, Dropped: o.st.dropped,
		GapMarkers: o.st.gapMarkers, Corrupt: o.st.corrupt,
		Depth: len(o.pending), Bytes: o.pendingBytes,
		Incarnation: o.inc, NextSeq: o.nextSeq, PendingGap: o.gap != nil,
		LastError: o.st.lastErr, LastErrorAt: o.st.lastErrAt,
	}
}

// Stats are counters (since the process started) and gauges for metrics.
type Stats struct {
	Appended    uint64            // events accepted by Append (gap markers not included)
	Published   uint64            // records published for the first time
	Resent      uint64            // records published again after an error or restart rewind
	Acked       uint64            // records acked by JetStream and removed from the outbox
	DupAcks     uint64            // acks JetStream flagged as duplicates (already stored)
	Dropped     uint64            // events dropped because the outbox was full (or a write failed)
	GapMarkers  uint64            // gap markers appended
	Corrupt     uint64            // corrupt records skipped when the outbox was opened
	Depth       int               // unacked records in the outbox
	Bytes       int64             // bytes of unacked records (headers included)
	Incarnation proto.Incarnation // the outbox's incarnation (0 if created before incarnations)
	NextSeq     uint64            // next seq to be assigned
	PendingGap  bool              // events were dropped and their gap marker is not yet appended
	// StreamDrift counts the stream's settings that differ from
	// StreamConfig (left unchanged, logged at WARN), StreamDriftRisky those
	// of them that can cost events or duplicates (StreamDrift.Risk).
	StreamDrift, StreamDriftRisky int
	LastError                     string // last error seen (outbox or publish); "" if none
	LastErrorAt                   time.Time
}

// GapMarkers returns how many gap markers the outbox has appended since it
// was opened (the agent's loop follows each with a full report).
func (o *Outbox) GapMarkers() uint64 {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.st.gapMarkers
}
