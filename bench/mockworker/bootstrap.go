package mockworker

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fastjson"
)

// SGLang's bootstrap protocol, played from the request's own fields: a
// request whose bootstrap_host and bootstrap_port name this worker is the
// prefill of its bootstrap_room; any other request with a room is its
// decode, which waits until that room's prefill is done, asking the
// prefill worker's GET /bootstrap/{room} (its bootstrap port is its HTTP
// port), then decodes without a prefill of its own.

// bootstrapWait bounds a decode's wait for its room's prefill.
const bootstrapWait = 30 * time.Second

// bootstrapRole reads the bootstrap fields: prefill when they name this
// worker, decode when they name another, neither without a room.
func (w *Worker) bootstrapRole(v *fastjson.Value) (room uint64, peer string, prefill, decode bool) {
	r := v.Get("bootstrap_room")
	if r == nil {
		return 0, "", false, false
	}
	room, _ = r.Uint64()
	// Joined as SGLang before its NetworkAddress joined them: an IPv6 host
	// has to come in brackets.
	peer = string(v.GetStringBytes("bootstrap_host")) + ":" + strconv.Itoa(v.GetInt("bootstrap_port"))
	if peer == w.Addr() {
		return room, peer, true, false
	}
	return room, peer, false, true
}

// room returns the channel closed once the room's prefill is done.
func (w *Worker) room(id uint64) chan struct{} {
	ch, _ := w.rooms.LoadOrStore(id, make(chan struct{}))
	return ch.(chan struct{})
}

// prefilled marks a room's prefill done.
func (w *Worker) prefilled(id uint64) {
	ch := w.room(id)
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// bootstrap answers GET /bootstrap/{room} once the room's prefill is done
// (200), or 504 after bootstrapWait.
func (w *Worker) bootstrap(ctx *fasthttp.RequestCtx) {
	id, err := strconv.ParseUint(strings.TrimPrefix(string(ctx.Path()), "/bootstrap/"), 10, 64)
	if err != nil {
		ctx.SetStatusCode(fasthttp.StatusBadRequest)
		return
	}
	select {
	case <-w.room(id):
		w.rooms.Delete(id)
		ctx.SetBodyString("ready")
	case <-time.After(bootstrapWait):
		ctx.SetStatusCode(fasthttp.StatusGatewayTimeout)
	}
}

// awaitPrefill waits for the room's prefill on the prefill worker.
func awaitPrefill(peer string, room uint64) error {
	client := http.Client{Timeout: bootstrapWait + time.Second}
	resp, err := client.Get(fmt.Sprintf("http://%s/bootstrap/%d", peer, room))
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("bootstrap %s room %d: status %d", peer, room, resp.StatusCode)
	}
	return nil
}
