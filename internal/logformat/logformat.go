// Package logformat is a slog handler whose format, text or JSON, a
// running process may change (a config reload's log.format): every logger
// made from it, and every one derived from those (With, WithGroup), writes
// its next line in the format set last.
package logformat

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync/atomic"
)

// Switch writes the lines of its loggers to one writer in the format set
// last.
type Switch struct {
	w   io.Writer
	cur atomic.Pointer[format]
}

// format is one format's root handler over the switch's writer.
type format struct {
	name string
	root slog.Handler
}

// New returns a Switch writing to w in format ("json"; anything else is
// text).
func New(w io.Writer, name string) *Switch {
	s := &Switch{w: w}
	s.Set(name)
	return s
}

// Set has the lines logged from now on written in format name ("json";
// anything else is text). Lines under way finish in the format they
// began in.
func (s *Switch) Set(name string) {
	if cur := s.cur.Load(); cur != nil && cur.name == name {
		return
	}
	f := &format{name: name, root: slog.NewTextHandler(s.w, nil)}
	if name == "json" {
		f.root = slog.NewJSONHandler(s.w, nil)
	}
	s.cur.Store(f)
}

// Logger returns a logger that writes in the switch's format.
func (s *Switch) Logger() *slog.Logger { return slog.New(&handler{sw: s}) }

// handler is a logger's handler: the switch's root in the format now, with
// the attributes and groups the logger was derived with, in their order.
type handler struct {
	sw      *Switch
	derived []derivation
	// made is the root of the format it was made for with derived applied,
	// made again when the format changed.
	made atomic.Pointer[madeFor]
}

// derivation is one WithAttrs (attrs) or WithGroup (group).
type derivation struct {
	group string
	attrs []slog.Attr
}

type madeFor struct {
	f *format
	h slog.Handler
}

// current is the handler of the format set now.
func (h *handler) current() slog.Handler {
	f := h.sw.cur.Load()
	if m := h.made.Load(); m != nil && m.f == f {
		return m.h
	}
	out := f.root
	for _, d := range h.derived {
		if d.attrs != nil {
			out = out.WithAttrs(d.attrs)
		} else {
			out = out.WithGroup(d.group)
		}
	}
	h.made.Store(&madeFor{f: f, h: out})
	return out
}

func (h *handler) Enabled(ctx context.Context, l slog.Level) bool { return h.current().Enabled(ctx, l) }

func (h *handler) Handle(ctx context.Context, r slog.Record) error { return h.current().Handle(ctx, r) }

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return &handler{sw: h.sw, derived: append(slices.Clip(h.derived), derivation{attrs: attrs})}
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &handler{sw: h.sw, derived: append(slices.Clip(h.derived), derivation{group: name})}
}
