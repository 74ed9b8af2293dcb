# Sourced on the GPU machine (root, repository root): starts Debian's dockerd from the bundle
# `cargo xtask gpu-bundle` packs (.device/docker.tar.xz), makes a base image without a registry,
# and sets GPU_RUN: the `docker run` options a GPU container needs there (the host's /usr, /opt
# etc. read-only, /dev/nvidia* devices, no network).
D=/tmp/gpuwatch-docker
# An engine a check before this one started (tests/gpu/all.sh runs several) is used as it is.
[ -d "$D/bin" ] && export PATH="$D/bin:$PATH"
if ! docker version >/dev/null 2>&1; then
  mkdir -p "$D" && tar -xJf .device/docker.tar.xz -C "$D"
  export PATH="$D/bin:$PATH"
  # The carried libraries only for the engine (and the runc it starts), not for the host's tools.
  LD_LIBRARY_PATH="$D/lib" setsid dockerd --iptables=false --ip6tables=false --bridge=none \
    --storage-driver=overlay2 --pidfile "$D/docker.pid" --data-root "$D/data" \
    --exec-root "$D/exec" --host unix:///var/run/docker.sock > "$D/dockerd.log" 2>&1 < /dev/null &
  for _ in $(seq 60); do docker version >/dev/null 2>&1 && break; sleep 0.5; done
fi
docker version --format 'docker {{.Server.Version}}' || { tail -20 "$D/dockerd.log"; exit 1; }
if ! docker image inspect gpuwatch-gpu-base:1 >/dev/null 2>&1; then
  mkdir -p "$D/rootfs" && (cd "$D/rootfs" && mkdir -p usr lib lib64 bin sbin etc opt dev proc sys tmp run work out)
  tar -C "$D/rootfs" -c . | docker import - gpuwatch-gpu-base:1 >/dev/null
fi
GPU_RUN="--network none"
for m in /usr /lib /lib64 /bin /sbin /etc /opt; do GPU_RUN="$GPU_RUN -v $m:$m:ro"; done
for n in /dev/nvidia0 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia-uvm-tools; do
  [ -e "$n" ] && GPU_RUN="$GPU_RUN --device $n"
done
GPU_RUN="$GPU_RUN -e PATH=/opt/torch/.venv/bin:/usr/local/nvidia/bin:/usr/bin:/bin -e LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/lib/x86_64-linux-gnu"
GPU_RUN="$GPU_RUN -v $PWD:/work:ro -w /work gpuwatch-gpu-base:1"
