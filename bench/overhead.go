package bench

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/fastroute/fastroute/bench/mockworker"
	"github.com/fastroute/fastroute/dataplane"
	"github.com/fastroute/fastroute/dataplane/config"
	"github.com/fastroute/fastroute/dataplane/router"
	"github.com/fastroute/fastroute/pickers"
)

// OverheadOptions configures RunOverhead.
type OverheadOptions struct {
	Connections int
	Duration    time.Duration
}

// OverheadBody is the non-streaming request both targets get.
var OverheadBody = []byte(`{"model":"mock-model","messages":[{"role":"user","content":"hi"}]}`)

// RunOverhead measures, in one run, a mock worker called directly and the
// same worker behind fastroute, and prints the added latency and the
// throughput ratio.
func RunOverhead(o OverheadOptions) error {
	mock, err := mockworker.Start("127.0.0.1:0", mockworker.Options{ID: 1, Tokens: 4})
	if err != nil {
		return err
	}
	defer mock.Close()
	cfg := config.Default()
	cfg.Listen, cfg.AdminListen = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Router.Mode = pickers.ModeLeastLoaded
	cfg.Router.BusyThreshold = 0
	cfg.Workers = []dataplane.WorkerSpec{{ID: 1, URL: mock.URL()}}
	r, err := router.Start(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		return err
	}
	defer r.Close()

	const path = "/v1/chat/completions"
	Load("warmup", r.Addr(), path, OverheadBody, o.Connections, o.Duration/5)
	direct := Load("direct", mock.Addr(), path, OverheadBody, o.Connections, o.Duration)
	routed := Load("fastroute", r.Addr(), path, OverheadBody, o.Connections, o.Duration)
	fmt.Printf("non-streaming chat, %d connections, %v per target, one machine\n", o.Connections, o.Duration)
	fmt.Println(direct)
	fmt.Println(routed)
	fmt.Printf("added p50 %v, added p99 %v, throughput %.0f%% of direct\n",
		(routed.P50 - direct.P50).Round(time.Microsecond), (routed.P99 - direct.P99).Round(time.Microsecond),
		100*routed.RPS()/direct.RPS())
	if direct.Errors+routed.Errors > 0 {
		return fmt.Errorf("%d requests failed", direct.Errors+routed.Errors)
	}
	return nil
}
