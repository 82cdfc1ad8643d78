package mockworker

import (
	"container/list"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fastjson"
)

// blockCache is the simulated engine's prefix cache: the keys of prompt
// blocks whose KV it holds, the least recently used first out.
type blockCache struct {
	size int
	lru  *list.List // of uint64 keys, most recent at the front
	at   map[uint64]*list.Element
}

func newBlockCache(size int) *blockCache {
	return &blockCache{size: size, lru: list.New(), at: make(map[uint64]*list.Element)}
}

// match returns how many of keys' leading blocks are cached, then caches
// all of them (the prompt's prefill computes the rest).
func (c *blockCache) match(keys []uint64) int {
	n := 0
	for n < len(keys) && c.at[keys[n]] != nil {
		n++
	}
	for _, k := range keys {
		if el := c.at[k]; el != nil {
			c.lru.MoveToFront(el)
			continue
		}
		c.at[k] = c.lru.PushFront(k)
		if c.lru.Len() > c.size {
			old := c.lru.Remove(c.lru.Back()).(uint64)
			delete(c.at, old)
		}
	}
	return n
}

// promptBlocks keys the whole blocks of blockBytes of a request's prompt
// text: what an engine's chat template would feed it (each message's
// role and text, a prompt, an input), each key the hash of the text up to
// its block's end.
func promptBlocks(v *fastjson.Value, blockBytes int) []uint64 {
	var text []byte
	var add func(v *fastjson.Value)
	add = func(v *fastjson.Value) {
		switch v.Type() {
		case fastjson.TypeString:
			text = append(append(text, v.GetStringBytes()...), '\n')
		case fastjson.TypeArray:
			for _, e := range v.GetArray() {
				add(e)
			}
		case fastjson.TypeObject:
			for _, k := range []string{"role", "content", "text"} {
				if f := v.Get(k); f != nil {
					add(f)
				}
			}
		}
	}
	for _, k := range []string{"instructions", "system", "messages", "prompt", "input"} {
		if f := v.Get(k); f != nil {
			add(f)
		}
	}
	keys := make([]uint64, 0, len(text)/blockBytes)
	d := xxhash.New()
	for ; len(text) >= blockBytes; text = text[blockBytes:] {
		_, _ = d.Write(text[:blockBytes])
		keys = append(keys, d.Sum64())
	}
	return keys
}
