package affinity

import (
	"encoding/binary"
	"errors"
	"sync/atomic"
)

// Replicas of a router in front of the same workers share what their
// prefix tables learn: each sends the keys it recorded anew, with the
// worker each went to, to the others, which take them in as if they had
// sent those prefixes themselves. A conversation whose turns reach
// different replicas then still finds the worker that holds its prefix.

// PrefixRecordBytes is the size of one shared record: a prefix's key (8
// bytes) and its worker's id (4 bytes), little-endian.
const PrefixRecordBytes = 12

// ErrPrefixRecords is returned for records whose length is not a
// multiple of PrefixRecordBytes.
var ErrPrefixRecords = errors.New("the prefix records' length is not a multiple of 12 bytes")

// journal lists the keys a table recorded anew, in a ring that one reader
// (Prefixes.Changed) follows: a writer takes the next place with one
// atomic add and fills it with one atomic store, the reader empties each
// place it reads, and a reader that falls a whole ring behind loses the
// oldest keys (hints, not state: the next record of the same prefix is
// shared again).
type journal struct {
	keys []atomic.Uint64
	mask uint64
	head atomic.Uint64 // places taken since the start
	tail uint64        // the reader's: places read since the start
	// The reader's calls that found the place at tail taken but still
	// empty: its writer is between its add and its store.
	waits int
}

// maxJournalWaits bounds the reader's calls that wait on one empty place:
// a writer stalled that long (or a key of 0, which reads as empty) loses
// that key, not the ones after it.
const maxJournalWaits = 100

func (j *journal) add(key uint64) {
	i := j.head.Add(1) - 1
	j.keys[i&j.mask].Store(key)
}

// Share starts the journal of keys recorded anew that Changed reads,
// holding up to size keys between two reads (rounded up to a power of
// two, at least 64). Call it before the table is used.
func (p *Prefixes) Share(size int) {
	n := roundSlots(size)
	p.journal = &journal{keys: make([]atomic.Uint64, n), mask: uint64(n - 1)}
}

// Changed appends to dst the records (AppendPrefixRecord) of the keys
// recorded anew since the last call, each with the worker its slot holds
// now (a key whose slot another key took over since is left out), and
// says how many keys were lost to the journal's wrapping around. One
// goroutine at a time may call it; a table without Share has none.
func (p *Prefixes) Changed(dst []byte) (out []byte, lost uint64) {
	j := p.journal
	if j == nil {
		return dst, 0
	}
	head := j.head.Load()
	if n := uint64(len(j.keys)); head-j.tail > n {
		lost, j.tail = head-j.tail-n, head-n
	}
	for ; j.tail < head; j.tail++ {
		// A writer that took the place may not have filled it yet: it is
		// read at a later call, and the places after it with it.
		k := j.keys[j.tail&j.mask].Swap(0)
		if k == 0 && j.waits < maxJournalWaits {
			j.waits++
			break
		}
		j.waits = 0
		if v := p.slots[k&p.mask].Load(); k != 0 && v != 0 && v>>32 == k>>32 {
			dst = AppendPrefixRecord(dst, k, v&MaxPrefixWorker)
		}
	}
	return dst, lost
}

// Recorded returns how many keys were recorded anew since Share (0
// without): every one goes to the journal once.
func (p *Prefixes) Recorded() uint64 {
	if p.journal == nil {
		return 0
	}
	return p.journal.head.Load()
}

// AppendPrefixRecord appends the record of key sent to worker.
func AppendPrefixRecord(dst []byte, key, worker uint64) []byte {
	dst = binary.LittleEndian.AppendUint64(dst, key)
	return binary.LittleEndian.AppendUint32(dst, uint32(worker))
}

// Learn takes in records another replica made (AppendPrefixRecord): each
// key's slot names its worker as a Record would, but nothing goes to the
// journal, so what is learned is not shared again. It returns how many
// records it read; records of worker 0 are skipped.
func (p *Prefixes) Learn(records []byte) (int, error) {
	if len(records)%PrefixRecordBytes != 0 {
		return 0, ErrPrefixRecords
	}
	n := 0
	for ; len(records) > 0; records = records[PrefixRecordBytes:] {
		k := binary.LittleEndian.Uint64(records)
		if w := uint64(binary.LittleEndian.Uint32(records[8:])); w != 0 {
			if s, v := &p.slots[k&p.mask], k&^MaxPrefixWorker|w; s.Load() != v {
				s.Store(v)
			}
			n++
		}
	}
	return n, nil
}
