package vmm

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// A full host disk is one guest's problem, not the fleet's (issue 19): disks hand write errors
// to the guest (werror=report), the gateway refuses new sandboxes below the watermark, and the
// vmm watches the home's free space, publishing a DiskEvent each time it crosses the watermark.
// Nothing here stops a VM.

// diskPoll is how often the home's free space is read; statfs is cheap.
const diskPoll = 2 * time.Second

// watchDisk publishes a DiskEvent when the home's free space crosses the watermark.
func (s *Service) watchDisk(ctx context.Context) {
	if s.cfg.MinFreeDisk == (home.Watermark{}) {
		return
	}
	t := time.NewTicker(diskPoll)
	defer t.Stop()
	low := false
	for {
		if sp, err := s.cfg.Home.Space(); err == nil {
			if now := s.cfg.MinFreeDisk.Low(sp); now != low {
				low = now
				s.publishDisk(sp, low)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Service) publishDisk(sp home.Space, low bool) {
	min := s.cfg.MinFreeDisk.Min(sp.Total)
	ev := api.DiskEvent{Host: s.cfg.Host, Low: low, FreeBytes: sp.Free, MinBytes: min, Time: time.Now().UTC()}
	if low {
		ev.Message = fmt.Sprintf("%s: %s has %s free, below the low watermark of %s: new sandboxes are refused; running ones keep running",
			home.ErrDiskFull, s.cfg.Home, home.Bytes(sp.Free), home.Bytes(min))
		s.log.Warn().Str("home", s.cfg.Home.String()).Uint64("free", sp.Free).Msg(ev.Message)
	} else {
		ev.Message = fmt.Sprintf("%s has %s free again, above the low watermark of %s", s.cfg.Home, home.Bytes(sp.Free), home.Bytes(min))
		s.log.Info().Msg(ev.Message)
	}
	b, _ := json.Marshal(ev)
	s.cfg.Bus.Publish(api.DiskEventSubject(s.cfg.Host), b)
}

// hostDiskLow says whether the home is below the watermark, or (no watermark) nearly full.
func (s *Service) hostDiskLow() (home.Space, bool) {
	sp, err := s.cfg.Home.Space()
	if err != nil {
		return sp, false
	}
	w := s.cfg.MinFreeDisk
	if w == (home.Watermark{}) {
		w = home.Watermark{Bytes: 64 << 20}
	}
	return sp, w.Low(sp)
}

// whyFailed turns the generic reason a VM failed for into the one the driver or the host knows:
// out of memory in its cgroup, or a full host disk (its writes failed with ENOSPC, or the home is
// below the watermark), never "hung" for those.
func (s *Service) whyFailed(m *machine, generic string) string {
	h, _ := m.vm.(hypervisor.Health)
	if h != nil {
		if r := h.ExitReason(); r != "" {
			return r
		}
	}
	sp, low := s.hostDiskLow()
	var de hypervisor.DiskErrors
	if h != nil {
		de = h.DiskErrors()
	}
	if low || de.NoSpace > 0 {
		r := fmt.Sprintf("%s: %s has %s free", home.ErrDiskFull, s.cfg.Home, home.Bytes(sp.Free))
		if de.NoSpace > 0 {
			r += fmt.Sprintf("; %d guest disk writes failed with no space left (last: %s)", de.NoSpace, de.Last)
		}
		return r + "; the VM was stopped"
	}
	return generic
}
