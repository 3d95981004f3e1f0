package keep

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Put leaves data with the parent under key, in place of what was there: a sealed
// memfd, which the parent holds without reading and no one can change.
func (k *Keeper) Put(key string, data []byte) error {
	if k == nil {
		return nil
	}
	fd, err := sealed(data)
	if err != nil {
		return err
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.l.send(opHold, key, fd); err != nil {
		unix.Close(fd)
		return fmt.Errorf("keep: %w", err)
	}
	k.replace(key, &entry{fd: fd, refs: 1})
	return nil
}

// Data returns what is kept under key, claiming it (Prune keeps it).
func (k *Keeper) Data(key string) ([]byte, error) {
	if k == nil {
		return nil, errNotKept
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.kept[key]
	if e == nil {
		return nil, errNotKept
	}
	var st unix.Stat_t
	if err := unix.Fstat(e.fd, &st); err != nil {
		return nil, fmt.Errorf("keep: %s: %w", key, err)
	}
	data := make([]byte, st.Size)
	for off := 0; off < len(data); {
		n, err := unix.Pread(e.fd, data[off:], int64(off))
		if err != nil || n == 0 {
			return nil, fmt.Errorf("keep: %s: short read: %v", key, err)
		}
		off += n
	}
	e.refs = max(e.refs, 1)
	return data, nil
}

// sealed returns a memfd holding data, sealed against every change.
func sealed(data []byte) (int, error) {
	fd, err := unix.MemfdCreate("egressd-keep", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("keep: memfd: %w", err)
	}
	for off := 0; off < len(data); {
		n, err := unix.Write(fd, data[off:])
		if err != nil {
			unix.Close(fd)
			return -1, fmt.Errorf("keep: memfd: %w", err)
		}
		off += n
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("keep: sealing the memfd: %w", err)
	}
	return fd, nil
}
