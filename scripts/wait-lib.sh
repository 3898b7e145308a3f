# Sourced by the project's shell scripts and tests: wait for a condition, never for a time; copy
# files the host may be renaming meanwhile.
#
#   wait_until SECONDS WHAT COMMAND [ARG...]
#
# Runs COMMAND every 50 ms until it succeeds (returns 0 then). After SECONDS, but never fewer
# than $KNOD_MIN_WAIT_S (default 60: a neighbour's load makes these machines ten times slower,
# and a condition that holds ends the wait at once), prints "timed out after N s waiting for
# WHAT" on stderr and returns 1. COMMAND is run as given (use `bash -c '...'` for a pipeline).
wait_until() {
    local seconds=$1 what=$2
    shift 2
    local floor=${KNOD_MIN_WAIT_S:-60}
    [ "$seconds" -ge "$floor" ] 2>/dev/null || seconds=$floor
    local end=$((SECONDS + seconds))
    while :; do
        "$@" && return 0
        if [ "$SECONDS" -ge "$end" ]; then
            echo "timed out after $seconds s waiting for $what" >&2
            return 1
        fi
        sleep 0.05
    done
}

#   copy_beside_renames ERRFILE DEST SOURCE...
#
# cp -a SOURCE... into DEST (a directory) while the host may be renaming files in the sources
# (a useradd renames a new /etc/passwd over the old one and removes its temporary files; an
# ldconfig renames its cache): cp then skips a file ("replaced while being copied") or finds one
# gone. Such a copy is emptied and made again, five times at most; an error of any other kind
# ends it at once. Returns 0 when a copy had no error, else 1 with cp's errors on stderr.
# ERRFILE keeps cp's errors of the last try.
copy_beside_renames() {
    local err=$1 dest=$2 try
    shift 2
    local gone="^cp: (cannot (stat|open|access) '[^']*'( for reading)?: No such file or directory|skipping file '[^']*', as it was replaced while being copied)$"
    for try in 1 2 3 4 5; do
        LC_ALL=C cp -a "$@" "$dest" 2>"$err" && return 0
        grep -qvE "$gone" "$err" && break # an error of another kind
        find "$dest" -mindepth 1 -delete
    done
    echo "cannot copy $* into $dest (try $try of 5):" >&2
    cat "$err" >&2
    return 1
}
