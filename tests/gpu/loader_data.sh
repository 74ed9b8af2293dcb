# Sourced by the loader checks: 256 files of 1 MiB for the I/O-bound phase, and the major:minor
# of the whole disk they live on (throttling a partition does not work), in DATA and MAJMIN.
DATA=$PWD/.loader-data
mkdir -p "$DATA"
for i in $(seq 0 255); do [ -f "$DATA/$i.bin" ] || head -c 1048576 /dev/urandom > "$DATA/$i.bin"; done
sync
src=$(df --output=source "$DATA" | tail -1)
disk=$(lsblk -no PKNAME "$src" 2>/dev/null | head -1); [ -n "$disk" ] || disk=$(basename "$src")
MAJMIN=$(cat /sys/block/$disk/dev 2>/dev/null)
DISK=/dev/$disk
echo "data on $src (disk $disk, $MAJMIN), fs $(stat -f -c %T "$DATA")" | tee "${OUT:-/tmp}/setup.txt"
