// Package etcdlocal runs a one-member etcd (the etcd binary, Debian's
// etcd-server) on loopback with its own data directory: for the tests and
// `fastroute demo-cluster`.
package etcdlocal

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/fastroute/fastroute/internal/loopback"
)

// ErrNotInstalled says the etcd binary is not on PATH.
var ErrNotInstalled = errors.New("etcd not found: install it (Debian: apt-get install etcd-server)")

// TLS names the files of an etcd that serves its clients over TLS and
// asks each for a certificate its CA file signs (--client-cert-auth).
type TLS struct{ CertFile, KeyFile, CAFile string }

// Process is a running (or stopped) etcd.
type Process struct {
	// Endpoint is its client address, host:port.
	Endpoint string
	tls      *TLS
	peer     string
	dir      string
	cmd      *exec.Cmd
	stopped  chan struct{}
	starts   int
}

// Start starts etcd on free loopback ports, keeping its data and logs in
// dir, and waits until it takes connections.
func Start(dir string) (*Process, error) { return StartTLS(dir, nil) }

// StartTLS is Start with the clients served over TLS as t says (nil:
// plain).
func StartTLS(dir string, t *TLS) (*Process, error) {
	if _, err := exec.LookPath("etcd"); err != nil {
		return nil, ErrNotInstalled
	}
	p := &Process{dir: dir, tls: t}
	var err error
	if p.Endpoint, err = loopback.FreeAddr(); err == nil {
		p.peer, err = loopback.FreeAddr()
	}
	if err == nil {
		err = p.Restart()
	}
	return p, err
}

// Restart starts a stopped etcd again on the same ports and data.
func (p *Process) Restart() error {
	p.starts++
	scheme := "http://"
	args := []string{"--name", "local", "--data-dir", filepath.Join(p.dir, "data"),
		"--listen-peer-urls", "http://" + p.peer, "--initial-advertise-peer-urls", "http://" + p.peer,
		"--initial-cluster", "local=http://" + p.peer}
	if t := p.tls; t != nil {
		scheme = "https://"
		args = append(args, "--cert-file", t.CertFile, "--key-file", t.KeyFile, "--trusted-ca-file", t.CAFile, "--client-cert-auth")
	}
	args = append(args, "--listen-client-urls", scheme+p.Endpoint, "--advertise-client-urls", scheme+p.Endpoint)
	p.cmd = exec.Command("etcd", args...)
	log, err := os.Create(filepath.Join(p.dir, fmt.Sprintf("etcd-%d.log", p.starts)))
	if err != nil {
		return err
	}
	p.cmd.Stdout, p.cmd.Stderr = log, log
	if err := p.cmd.Start(); err != nil {
		log.Close()
		return err
	}
	stopped := make(chan struct{})
	p.stopped = stopped
	cmd := p.cmd
	go func() { _ = cmd.Wait(); log.Close(); close(stopped) }()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", p.Endpoint, 100*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
	}
	p.Stop()
	return errors.New("etcd did not start within 10s")
}

// Stop kills etcd (a crash, as far as its clients can tell) and waits for
// it to exit.
func (p *Process) Stop() {
	if p.cmd == nil {
		return
	}
	select {
	case <-p.stopped:
	default:
		_ = p.cmd.Process.Kill()
		<-p.stopped
	}
}
