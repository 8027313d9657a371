package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/hashicorp/yamux"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// handleCopyIn: Response (ready or refused), then the host's Data frames and End, then a final
// Response once the file is in place. The file is written to a temporary name in the target
// directory, synced and renamed, so readers see the old file or the whole new one.
func (s *Server) handleCopyIn(st *yamux.Stream, req *agentproto.CopyInRequest) {
	defer st.Close()
	tmp, err := s.prepareCopyIn(req)
	if err != nil {
		s.replyErr(st, err)
		return
	}
	s.reply(st, agentproto.Response{})
	err = receiveFile(bufio.NewReaderSize(st, 64<<10), tmp, req.Size)
	if err == nil {
		err = finishCopyIn(tmp, req)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		s.log.Warn().Err(err).Str(logPath, req.Path).Msg("copy-in failed")
	}
	s.replyErr(st, err)
}

func (s *Server) prepareCopyIn(req *agentproto.CopyInRequest) (*os.File, error) {
	if !filepath.IsAbs(req.Path) {
		return nil, errdefs.Invalid("copy-in: path %.200q is not absolute", req.Path)
	}
	if req.Size < 0 {
		return nil, errdefs.Invalid("copy-in: negative size")
	}
	if fi, err := os.Stat(req.Path); err == nil && fi.IsDir() {
		return nil, errdefs.Invalid("copy-in: %s is a directory", req.Path)
	}
	dir := filepath.Dir(req.Path)
	if req.MkdirAll {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("copy-in: %w", err)
		}
	}
	tmp, err := os.CreateTemp(dir, ".nexus-copy-*")
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, errdefs.NotFound("copy-in: directory %s does not exist", dir)
		}
		return nil, fmt.Errorf("copy-in: %w", unwrapPathErr(err))
	}
	return tmp, nil
}

// receiveFile writes Data frames to f until End; more or fewer bytes than size is an error.
func receiveFile(r io.Reader, f *os.File, size int64) error {
	buf := make([]byte, agentproto.MaxFramePayload)
	var got int64
	var werr error
	for {
		t, p, err := agentproto.ReadFrame(r, buf)
		if err != nil {
			return fmt.Errorf("copy-in: %w", err)
		}
		switch t {
		case agentproto.FrameData:
			got += int64(len(p))
			if got > size {
				return errdefs.Invalid("copy-in: more data than the announced %d bytes", size)
			}
			if werr == nil {
				_, werr = f.Write(p)
			}
		case agentproto.FrameEnd:
			if werr != nil {
				return fmt.Errorf("copy-in: %w", unwrapPathErr(werr))
			}
			if got != size {
				return errdefs.Invalid("copy-in: got %d of the announced %d bytes", got, size)
			}
			return nil
		default:
			return errdefs.Invalid("copy-in: unexpected %s frame", t)
		}
	}
}

func finishCopyIn(tmp *os.File, req *agentproto.CopyInRequest) error {
	mode := fs.FileMode(req.Mode) & fs.ModePerm
	if req.Mode == 0 {
		mode = 0o644
	}
	if err := tmp.Chmod(mode); err != nil {
		return fmt.Errorf("copy-in: %w", unwrapPathErr(err))
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("copy-in: %w", unwrapPathErr(err))
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("copy-in: %w", unwrapPathErr(err))
	}
	if err := os.Rename(tmp.Name(), req.Path); err != nil {
		return fmt.Errorf("copy-in: %w", unwrapPathErr(err))
	}
	return nil
}

// handleCopyOut: Response with the file's size and mode, then Data frames and End (or an Error
// frame if reading fails midway).
func (s *Server) handleCopyOut(st *yamux.Stream, req *agentproto.CopyOutRequest) {
	defer st.Close()
	f, info, err := openCopyOut(req.Path)
	if err != nil {
		s.replyErr(st, err)
		return
	}
	defer f.Close()
	s.reply(st, agentproto.Response{File: info})
	fw := agentproto.NewFrameWriter(st)
	buf := make([]byte, agentproto.FrameHeaderLen+agentproto.MaxFramePayload)
	for {
		n, err := f.Read(buf[agentproto.FrameHeaderLen:])
		if n > 0 {
			if werr := fw.WriteHeaded(agentproto.FrameData, buf[:agentproto.FrameHeaderLen+n]); werr != nil {
				return
			}
		}
		if err == io.EOF {
			fw.WriteFrame(agentproto.FrameEnd, nil)
			return
		}
		if err != nil {
			fw.WriteFrame(agentproto.FrameError, []byte(oneLine(fmt.Sprintf("copy-out: %v", unwrapPathErr(err)))))
			return
		}
	}
}

func openCopyOut(path string) (*os.File, *agentproto.FileInfo, error) {
	if !filepath.IsAbs(path) {
		return nil, nil, errdefs.Invalid("copy-out: path %.200q is not absolute", path)
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, errdefs.NotFound("copy-out: %s does not exist", path)
		}
		return nil, nil, fmt.Errorf("copy-out: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("copy-out: %w", err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, errdefs.Invalid("copy-out: %s is not a regular file", path)
	}
	return f, &agentproto.FileInfo{Size: fi.Size(), Mode: uint32(fi.Mode().Perm())}, nil
}
