package mockworker

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// EngineOptions turns the mock worker into a simulated inference engine
// with continuous batching, the way vLLM and SGLang schedule: at most
// MaxNumSeqs requests run in one batch, the rest wait in a FIFO queue, and
// every step of the batch gives each running request one token.
//
// A step lasts InterTokenLatency × (1 + LoadFactor × (running−1)), plus
// PrefillPerToken for every prompt token of the requests admitted in that
// step (their first token comes at its end), all divided by Speed. Each
// request holds KV cache blocks of BlockSize tokens for its prompt and the
// tokens generated so far; a request waits while its prompt does not fit in
// the free blocks, and when the cache runs out during decoding the latest
// admitted request is preempted back to the head of the queue (vLLM's
// recompute preemption). With PrefixCache, the prompts' blocks stay
// cached after their prefill (vLLM's automatic prefix caching), up to
// KVBlocks of them, the least recently used going first, and a prompt
// prefills only what follows its longest cached prefix.
type EngineOptions struct {
	MaxNumSeqs        int           // running slots; 0 turns the simulator off
	InterTokenLatency time.Duration // decode step at a batch of one
	LoadFactor        float64       // extra step time per further running request, as a share of InterTokenLatency
	PrefillPerToken   time.Duration // prefill time per prompt token
	Speed             float64       // scales every duration by 1/Speed (a CPU-like engine: 1/6)
	KVBlocks          int           // KV cache size in blocks
	BlockSize         int           // tokens per block
	MaxLoRA           int           // adapters one batch may serve (reported in vllm:lora_requests_info)
	PrefixCache       bool          // keep prompts' blocks for the prompts that share them
}

// Engine defaults.
const (
	DefaultInterTokenLatency = 10 * time.Millisecond
	DefaultLoadFactor        = 0.02
	DefaultPrefillPerToken   = 100 * time.Microsecond
	DefaultKVBlocks          = 4096
	DefaultBlockSize         = 16
	DefaultMaxLoRA           = 4
)

func (o *EngineOptions) fill() {
	if o.InterTokenLatency <= 0 {
		o.InterTokenLatency = DefaultInterTokenLatency
	}
	if o.LoadFactor < 0 {
		o.LoadFactor = 0
	}
	if o.PrefillPerToken < 0 {
		o.PrefillPerToken = 0
	}
	if !(o.Speed > 0) {
		o.Speed = 1
	}
	if o.KVBlocks <= 0 {
		o.KVBlocks = DefaultKVBlocks
	}
	if o.BlockSize <= 0 {
		o.BlockSize = DefaultBlockSize
	}
	if o.MaxLoRA <= 0 {
		o.MaxLoRA = DefaultMaxLoRA
	}
}

// errTooLong refuses a request that could never fit in the KV cache.
var errTooLong = errors.New("prompt plus max_tokens exceed the KV cache")

// seq is one request inside the engine.
type seq struct {
	prompt, maxOut int
	lora           string
	prefix         []uint64      // the keys of its prompt's whole blocks (promptBlocks)
	transferred    bool          // its prompt's KV came from a prefill worker: its blocks are cached, not prefilled
	notify         chan struct{} // a token came, or the request ended (cap 1)

	// guarded by engine.mu
	generated int
	lastToken time.Time // when its last token came
	blocks    int
	prefilled bool // its prompt (and tokens so far) are in the cache
	done      bool // finished or dropped
}

// tokens returns how many tokens the request has so far and whether it ended.
func (s *seq) tokens(e *engine) (n int, done bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return s.generated, s.done
}

// engine is the scheduler of one simulated inference server.
type engine struct {
	o    EngineOptions
	wake chan struct{}
	stop chan struct{}
	wg   sync.WaitGroup

	mu           sync.Mutex
	waiting      []*seq
	running      []*seq
	freeBlocks   int
	promptTokens uint64
	genTokens    uint64
	finished     uint64
	gaps         uint64      // gaps between two tokens of a request (vllm:inter_token_latency_seconds_count)
	gapSeconds   float64     // their time in all (its _sum)
	cache        *blockCache // nil: no prefix caching
	cacheQueries uint64      // prompt tokens looked up in the cache
	cacheHits    uint64      // of those, the tokens found
}

func newEngine(o EngineOptions) *engine {
	o.fill()
	e := &engine{o: o, wake: make(chan struct{}, 1), stop: make(chan struct{}), freeBlocks: o.KVBlocks}
	if o.PrefixCache {
		e.cache = newBlockCache(o.KVBlocks)
	}
	e.wg.Go(e.run)
	return e
}

// close stops the scheduler and ends every request still inside, so the
// server's shutdown does not wait for answers that will never come.
func (e *engine) close() {
	close(e.stop)
	e.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range append(e.running, e.waiting...) {
		e.end(s)
	}
	e.running, e.waiting = nil, nil
}

func (e *engine) blocksFor(tokens int) int { return (tokens + e.o.BlockSize - 1) / e.o.BlockSize }

// submit queues a request; its tokens are announced on s.notify.
// prefix keys the prompt's whole blocks, for the prefix cache.
func (e *engine) submit(prompt, maxOut int, lora string, prefix []uint64, transferred bool) (*seq, error) {
	if e.blocksFor(prompt+maxOut) > e.o.KVBlocks {
		return nil, errTooLong
	}
	s := &seq{prompt: prompt, maxOut: maxOut, lora: lora, prefix: prefix, transferred: transferred, notify: make(chan struct{}, 1)}
	e.mu.Lock()
	e.waiting = append(e.waiting, s)
	e.mu.Unlock()
	select {
	case e.wake <- struct{}{}:
	default:
	}
	return s, nil
}

// drop removes a request whose client went away: its slot and its cache
// blocks are free for the next step.
func (e *engine) drop(s *seq) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if s.done {
		return
	}
	e.waiting = slices.DeleteFunc(e.waiting, func(x *seq) bool { return x == s })
	e.running = slices.DeleteFunc(e.running, func(x *seq) bool { return x == s })
	e.end(s)
}

// end frees s's blocks and wakes its reader; the caller holds mu.
func (e *engine) end(s *seq) {
	e.freeBlocks += s.blocks
	s.blocks, s.done = 0, true
	s.signal()
}

func (s *seq) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (e *engine) run() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	for {
		e.mu.Lock()
		prefill := e.admit()
		n := len(e.running)
		e.mu.Unlock()
		if n == 0 {
			select {
			case <-e.wake:
				continue
			case <-e.stop:
				return
			}
		}
		timer.Reset(e.stepTime(n, prefill))
		select {
		case <-timer.C:
		case <-e.stop:
			return
		}
		e.mu.Lock()
		e.advance()
		e.mu.Unlock()
	}
}

// admit moves waiting requests into the batch while slots and cache blocks
// allow, in arrival order, and returns the tokens they must prefill.
func (e *engine) admit() (prefill int) {
	for len(e.waiting) > 0 && len(e.running) < e.o.MaxNumSeqs {
		s := e.waiting[0]
		need := e.blocksFor(s.prompt + s.generated + 1)
		if need > e.freeBlocks {
			break
		}
		e.waiting = e.waiting[1:]
		e.freeBlocks -= need
		s.blocks = need
		e.running = append(e.running, s)
		if !s.prefilled {
			s.prefilled = true
			prefill += s.prompt + s.generated - e.cached(s)
			e.promptTokens += uint64(s.prompt)
		}
	}
	return prefill
}

// cached returns the tokens of s's prompt the prefix cache holds (at
// most all but one: the last is computed anyway), and caches the rest. A
// transferred prompt's blocks are cached as vLLM's decode engine caches
// the blocks its KV connector brought, neither found nor counted.
func (e *engine) cached(s *seq) int {
	if e.cache == nil || len(s.prefix) == 0 {
		return 0
	}
	if s.transferred {
		e.cache.match(s.prefix)
		return 0
	}
	hit := e.cache.match(s.prefix) * e.o.BlockSize
	hit = min(hit, s.prompt-1)
	e.cacheQueries += uint64(s.prompt)
	e.cacheHits += uint64(hit)
	return hit
}

func (e *engine) stepTime(running, prefill int) time.Duration {
	d := float64(e.o.InterTokenLatency)*(1+e.o.LoadFactor*float64(running-1)) + float64(e.o.PrefillPerToken)*float64(prefill)
	return time.Duration(d / e.o.Speed)
}

// advance ends one step: every running request that has its cache blocks
// gains a token; finished ones leave the batch.
func (e *engine) advance() {
	now := time.Now()
	for i := 0; i < len(e.running); i++ {
		s := e.running[i]
		need := e.blocksFor(s.prompt + s.generated + 1)
		for need > s.blocks && e.freeBlocks == 0 && len(e.running)-1 > i {
			e.preempt(e.running[len(e.running)-1])
		}
		if need > s.blocks {
			if e.freeBlocks == 0 {
				continue // no block for it this step
			}
			e.freeBlocks--
			s.blocks++
		}
		s.generated++
		e.genTokens++
		if s.generated > 1 {
			e.gaps++
			e.gapSeconds += now.Sub(s.lastToken).Seconds()
		}
		s.lastToken = now
		if s.generated >= s.maxOut {
			e.finished++
			e.running = slices.Delete(e.running, i, i+1)
			i--
			e.end(s)
			continue
		}
		s.signal()
	}
}

// preempt sends the latest admitted request back to the head of the queue;
// it keeps the tokens it has sent and recomputes its cache when readmitted.
func (e *engine) preempt(s *seq) {
	e.running = e.running[:len(e.running)-1]
	e.freeBlocks += s.blocks
	s.blocks, s.prefilled = 0, false
	e.waiting = slices.Insert(e.waiting, 0, s)
}

// engineStats is what the metrics endpoint reports.
type engineStats struct {
	running, waiting           int
	kvUsage                    float64
	promptTokens, genTokens    uint64
	finished                   uint64
	gaps                       uint64
	gapSeconds                 float64
	cacheQueries, cacheHits    uint64
	runningLoRAs, waitingLoRAs []string
}

func (e *engine) stats() engineStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := engineStats{
		running: len(e.running), waiting: len(e.waiting),
		kvUsage:      1 - float64(e.freeBlocks)/float64(e.o.KVBlocks),
		promptTokens: e.promptTokens, genTokens: e.genTokens, finished: e.finished,
		gaps: e.gaps, gapSeconds: e.gapSeconds,
		cacheQueries: e.cacheQueries, cacheHits: e.cacheHits,
	}
	for _, s := range e.running {
		if s.lora != "" {
			st.runningLoRAs = append(st.runningLoRAs, s.lora)
		}
	}
	for _, s := range e.waiting {
		if s.lora != "" {
			st.waitingLoRAs = append(st.waitingLoRAs, s.lora)
		}
	}
	slices.Sort(st.runningLoRAs)
	slices.Sort(st.waitingLoRAs)
	st.runningLoRAs = slices.Compact(st.runningLoRAs)
	st.waitingLoRAs = slices.Compact(st.waitingLoRAs)
	return st
}
