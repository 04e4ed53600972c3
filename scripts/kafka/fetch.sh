#!/usr/bin/env bash
# Fetch the Kafka broker (KRaft) and Spark's Kafka source jars from Maven Central into .cache/kafka
# (QF_KAFKA_CACHE overrides), with the poms beside this script. Idempotent: a stamp holding the poms'
# checksum makes a second run return at once. Maven's own download cache is its usual one (~/.m2, or
# MAVEN_REPO_LOCAL); the jars are copied out of it, so the cache folder is all the project reads.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${QF_KAFKA_CACHE:-$root/.cache/kafka}"
plugin=org.apache.maven.plugins:maven-dependency-plugin:3.8.1
sum="$(cat "$here/broker-pom.xml" "$here/spark-pom.xml" | sha256sum | cut -c1-16)"
if [ -f "$cache/stamp" ] && [ "$(cat "$cache/stamp")" = "$sum" ]; then
  exit 0
fi
command -v mvn >/dev/null 2>&1 || { echo "[kafka] Maven (mvn) is needed to fetch the Kafka jars (apt-get install maven)" >&2; exit 1; }
repo=()
[ -n "${MAVEN_REPO_LOCAL:-}" ] && repo=("-Dmaven.repo.local=$MAVEN_REPO_LOCAL")
mkdir -p "$cache"
rm -rf "$cache/broker.tmp" "$cache/spark.tmp"
for part in broker spark; do
  echo "[kafka] fetching the $part jars into $cache/$part"
  if ! mvn -B -q "${repo[@]}" -f "$here/$part-pom.xml" "$plugin:copy-dependencies" \
       -DoutputDirectory="$cache/$part.tmp" -DincludeScope=runtime >"$cache/mvn-$part.log" 2>&1; then
    grep -E 'ERROR' "$cache/mvn-$part.log" | head -5 >&2
    echo "[kafka] mvn failed: see $cache/mvn-$part.log" >&2
    exit 1
  fi
done
for part in broker spark; do
  rm -rf "$cache/$part"
  mv "$cache/$part.tmp" "$cache/$part"
done
echo "$sum" > "$cache/stamp"
echo "[kafka] ready: $(ls "$cache/broker" | wc -l) broker jars, $(ls "$cache/spark" | wc -l) Spark jars in $cache"
