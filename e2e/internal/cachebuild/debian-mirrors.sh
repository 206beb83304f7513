# Sourced by the cache build scripts (e2e/harness/<name>/build.sh, which find it at
# ../../internal/cachebuild/ from their own directory, in the repository and
# where cachebuild.Run writes them).

# host_debian_mirrors prints the URIs of the host's Debian archive, once each, in apt's
# order: the entries of type deb whose suite is the host's codename, in one-line .list and
# deb822 .sources files. $1, if given, is the root whose /etc is read (tests).
host_debian_mirrors() {
	local root=${1:-} codename f
	codename=$(. "$root/etc/os-release" 2>/dev/null && echo "${VERSION_CODENAME:-}")
	[[ -n $codename ]] || return 0
	for f in "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*.list "$root"/etc/apt/sources.list.d/*.sources; do
		[[ -f $f ]] || continue
		if [[ $f == *.list ]]; then
			# deb [options] URI suite components...
			sed -E 's/#.*//; s/\[[^]]*\]//' "$f" | awk -v c="$codename" '$1 == "deb" && $3 == c { print $2 }'
		else
			awk -v c="$codename" '
				function flush() {
					if (types ~ /(^| )deb( |$)/ && enabled != "no")
						for (i = 1; i <= ns; i++) if (s[i] == c) { for (j = 1; j <= nu; j++) print u[j]; break }
					types = ""; enabled = ""; ns = 0; nu = 0
				}
				/^[ \t]*#/ { next }
				/^[ \t]*$/ { flush(); next }
				{
					k = tolower($1); sub(/:$/, "", k); $1 = ""; sub(/^ +/, "")
					if (k == "types") types = $0
					else if (k == "enabled") enabled = tolower($0)
					else if (k == "uris") nu = split($0, u, " ")
					else if (k == "suites") ns = split($0, s, " ")
				}
				END { flush() }' "$f"
		fi
	done | awk '!seen[$0]++'
}
