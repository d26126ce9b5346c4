#!/bin/sh
# Copy a CPython interpreter into a folder that runs in any Linux image (no Python, no glibc needed there).
#
#   bundle-python.sh PYTHON DEST [RUNTIME]
#
# DEST gets bin/python3, lib/pythonX.Y (the standard library without tests, IDLE, Tk and ensurepip) and
# lib/*.so*: every shared library the interpreter and its extension modules load, glibc and its loader
# included. The interpreter is patched (patchelf) to start through that loader and to look only in that lib/,
# so the image's own libraries are never used. RUNTIME is where DEST will be mounted when it runs
# (default: DEST), because the loader's path in an ELF header must be absolute.
# Child processes are untouched: nothing here sets LD_LIBRARY_PATH, so commands the agent runs use the
# image's own libraries.
set -eu

[ $# -ge 2 ] || { echo "usage: $0 PYTHON DEST [RUNTIME]" >&2; exit 2; }
python=$(readlink -f "$1")
dest=$2
runtime=${3:-$2}
for tool in patchelf ldd tar; do
    command -v "$tool" >/dev/null || { echo "$0: $tool is needed" >&2; exit 2; }
done

stdlib=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
dynload=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("DESTSHARED"))')
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
loader=$(patchelf --print-interpreter "$python")
target_lib="$dest/lib"
target_stdlib="$target_lib/python$version"

mkdir -p "$dest/bin" "$target_stdlib/lib-dynload"
cp "$python" "$dest/bin/python3"
ln -sf python3 "$dest/bin/python$version"

# The standard library, minus what an agent never imports.
tar -C "$stdlib" -cf - \
    --exclude=__pycache__ --exclude='./test' --exclude='*/test' --exclude='*/tests' --exclude='./idlelib' \
    --exclude='./tkinter' --exclude='./turtledemo' --exclude='./ensurepip' --exclude='./lib2to3' \
    --exclude='./site-packages' --exclude='./dist-packages' --exclude='./config-*' --exclude='./lib-dynload' . \
    | tar -C "$target_stdlib" -xf -
for module in "$dynload"/*.so; do
    case "$(basename "$module")" in _tkinter*|_test*|xxlimited*|_xx*) continue ;; esac
    cp "$module" "$target_stdlib/lib-dynload/"
done

# Every shared library they load, resolved on this machine, plus the loader itself.
libs=$(ldd "$dest/bin/python3" "$target_stdlib"/lib-dynload/*.so 2>/dev/null | sed -n 's|.*=> \(/[^ ]*\) .*|\1|p' | sort -u)
for lib in $libs; do
    cp -L "$lib" "$target_lib/"
done
loader_name=$(basename "$loader")
cp -L "$loader" "$target_lib/$loader_name"

# Debug symbols are dead weight in a copy made for every sandbox (strip comes with binutils, when present).
if command -v strip >/dev/null; then
    strip --strip-unneeded "$dest/bin/python3" "$target_stdlib"/lib-dynload/*.so "$target_lib"/*.so* 2>/dev/null || true
fi

# Start through the bundled loader; find libraries only in the bundle (DT_RPATH also covers dlopen'ed modules).
patchelf --set-interpreter "$runtime/lib/$loader_name" --force-rpath --set-rpath '$ORIGIN/../lib' "$dest/bin/python3"
for module in "$target_stdlib"/lib-dynload/*.so; do
    patchelf --force-rpath --set-rpath '$ORIGIN/../..' "$module"
done
for lib in "$target_lib"/*.so*; do
    case "$(basename "$lib")" in "$loader_name"|libc.so.*) continue ;; esac
    patchelf --force-rpath --set-rpath '$ORIGIN' "$lib"
done
# Every library any of them needs must now be in the bundle.
for elf in "$dest/bin/python3" "$target_stdlib"/lib-dynload/*.so "$target_lib"/*.so*; do
    for needed in $(patchelf --print-needed "$elf" 2>/dev/null); do
        [ -e "$target_lib/$needed" ] || { echo "$0: $needed (needed by $elf) is not in the bundle" >&2; exit 1; }
    done
done
echo "bundled Python $version into $dest ($(du -sh "$dest" | cut -f1)), to run from $runtime"
