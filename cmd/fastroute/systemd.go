package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"

	"github.com/coreos/go-systemd/v22/activation"
	"github.com/coreos/go-systemd/v22/daemon"
	"github.com/fastroute/fastroute/dataplane/config"
	"golang.org/x/sys/unix"
)

// systemdListeners returns the sockets systemd passed the process (socket
// activation: LISTEN_FDS, for this process's LISTEN_PID), each by the
// config key it serves: its name (a socket unit's FileDescriptorName=)
// when that is listen or admin_listen, else the key whose address is the
// socket's. A socket that is neither, or not a TCP listener, is an error.
// The environment's LISTEN_* variables are unset, so an upgrade's new
// process does not read them (it gets the sockets from this one).
func systemdListeners(cfg config.Config) (map[string]net.Listener, error) {
	sockets := map[string]net.Listener{}
	var errs []error
	for _, f := range activation.Files(true) {
		ln, err := net.FileListener(f)
		f.Close() // ln holds a descriptor of its own
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("socket %s from systemd: %w", f.Name(), err))
			continue
		case ln.Addr().Network() != "tcp":
			ln.Close()
			errs = append(errs, fmt.Errorf("socket %s from systemd: %s is not a TCP listener", f.Name(), ln.Addr()))
			continue
		}
		key := f.Name()
		if key != "listen" && key != "admin_listen" {
			key = keyOfAddress(cfg, ln.Addr())
		}
		switch {
		case key == "":
			err = fmt.Errorf("socket %s from systemd (%s) is neither listen (%s) nor admin_listen (%s): name it FileDescriptorName=listen or admin_listen",
				f.Name(), ln.Addr(), cfg.Listen, cfg.AdminListen)
		case sockets[key] != nil:
			err = fmt.Errorf("socket %s from systemd (%s): a second socket for %s", f.Name(), ln.Addr(), key)
		}
		if err != nil {
			ln.Close()
			errs = append(errs, err)
			continue
		}
		sockets[key] = ln
	}
	if len(errs) > 0 {
		for _, ln := range sockets {
			ln.Close()
		}
		return nil, errors.Join(errs...)
	}
	return sockets, nil
}

// keyOfAddress returns the config key (listen, admin_listen) whose address
// is addr's, "" for none: the same port and IP, any unspecified IP (an
// empty host, 0.0.0.0, ::) matching any other.
func keyOfAddress(cfg config.Config, addr net.Addr) string {
	got, ok := addr.(*net.TCPAddr)
	if !ok {
		return ""
	}
	for _, k := range []struct{ key, address string }{{"listen", cfg.Listen}, {"admin_listen", cfg.AdminListen}} {
		want, err := net.ResolveTCPAddr("tcp", k.address)
		if err != nil || want.Port != got.Port {
			continue
		}
		if want.IP.Equal(got.IP) || (unspecified(want.IP) && unspecified(got.IP)) {
			return k.key
		}
	}
	return ""
}

func unspecified(ip net.IP) bool { return ip == nil || ip.IsUnspecified() }

// notify tells systemd of the service's state (sd_notify) when it started
// the process with Type=notify (NOTIFY_SOCKET); a message it cannot send
// is no failure of the router's.
func notify(state string) { _, _ = daemon.SdNotify(false, state) }

// notifyReloading says a reload begins, with the monotonic clock's
// reading in microseconds (systemd's Type=notify-reload wants both); the
// reload's end is a READY=1 (notifyReady).
func notifyReloading() {
	var now unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &now)
	notify(daemon.SdNotifyReloading + "\nMONOTONIC_USEC=" + strconv.FormatInt(now.Nano()/1000, 10))
}

// notifyReady says the process serves, and that it is the service's main
// process: an upgrade's new process so takes over from the old one
// (NotifyAccess=all).
func notifyReady() {
	notify(daemon.SdNotifyReady + "\nMAINPID=" + strconv.Itoa(os.Getpid()))
}
