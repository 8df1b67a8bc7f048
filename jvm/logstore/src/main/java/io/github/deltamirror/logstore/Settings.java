package io.github.deltamirror.logstore;

import java.io.File;
import java.net.URI;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Locale;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * The LogStore's settings, read from the Hadoop configuration of each call (docs/commit-service.md,
 * "LogStore settings"), so they can change at runtime. A key is also accepted with Spark's
 * {@code spark.hadoop.} prefix, in case it was set through the session conf with it.
 */
final class Settings {
    static final String URL = "delta.mirror.commit.url";
    static final String ROOTS = "delta.mirror.commit.roots";
    static final String OUTSIDE = "delta.mirror.commit.outside";
    static final String TIMEOUT_MS = "delta.mirror.commit.timeoutMs";
    static final String RETRIES = "delta.mirror.commit.retries";
    static final String TOKEN = "delta.mirror.commit.token";
    static final String TOKEN_ENV = "DELTA_MIRROR_COMMIT_TOKEN";
    /**
     * Fault injection for tests, off unless set: {@code halt-after-commit} halts the JVM (as a
     * SIGKILL would) once the store has committed and before {@code <v>.json} is written;
     * {@code delay-before-commit:<ms>} sleeps before each POST (to make two writers overlap).
     */
    static final String FAILPOINT = "delta.mirror.commit.failpoint";

    static final long DEFAULT_TIMEOUT_MS = 10_000;
    static final int DEFAULT_RETRIES = 8;

    /** Base URL without a trailing slash, or null: every table passes through. */
    final String url;
    /** Normalised governed prefixes (see {@link #normalise}). */
    final List<String> roots;
    final boolean refuseOutside;
    final long timeoutMs;
    final int retries;
    /** Never logged, never in a message. */
    private final String token;
    private final String failpoint;

    private Settings(String url, List<String> roots, boolean refuseOutside, long timeoutMs, int retries,
                     String token, String failpoint) {
        this.url = url;
        this.roots = roots;
        this.refuseOutside = refuseOutside;
        this.timeoutMs = timeoutMs;
        this.retries = retries;
        this.token = token;
        this.failpoint = failpoint;
    }

    /** Act on the test failpoint {@code name} when it is armed (see {@link #FAILPOINT}). */
    void failpoint(String name) throws java.io.InterruptedIOException {
        if (failpoint == null || !failpoint.startsWith(name)) {
            return;
        }
        if (name.equals("halt-after-commit")) {
            Runtime.getRuntime().halt(137);
        }
        String[] parts = failpoint.split(":", 2);
        if (parts.length == 2) {
            try {
                Thread.sleep(Long.parseLong(parts[1].trim()));
            } catch (NumberFormatException e) {
                // not a delay: ignored
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new java.io.InterruptedIOException("interrupted at failpoint " + name);
            }
        }
    }

    static Settings from(Configuration conf) {
        String url = get(conf, URL);
        if (url != null) {
            while (url.endsWith("/")) {
                url = url.substring(0, url.length() - 1);
            }
        }
        List<String> roots = new ArrayList<>();
        String rootList = get(conf, ROOTS);
        if (rootList != null) {
            for (String r : rootList.split(",")) {
                if (!r.isBlank()) {
                    roots.add(normalise(r.trim()));
                }
            }
        }
        String outside = get(conf, OUTSIDE);
        boolean refuse = outside != null && outside.equalsIgnoreCase("refuse");
        long timeout = DEFAULT_TIMEOUT_MS;
        String t = get(conf, TIMEOUT_MS);
        if (t != null) {
            try {
                timeout = Math.max(1, Long.parseLong(t));
            } catch (NumberFormatException e) {
                // keep the default
            }
        }
        int retries = DEFAULT_RETRIES;
        String n = get(conf, RETRIES);
        if (n != null) {
            try {
                retries = Math.max(1, Integer.parseInt(n));
            } catch (NumberFormatException e) {
                // keep the default
            }
        }
        String token = System.getenv(TOKEN_ENV);
        if (token == null || token.isBlank()) {
            token = get(conf, TOKEN);
        }
        return new Settings(url, Collections.unmodifiableList(roots), refuse, timeout, retries,
            token == null || token.isBlank() ? null : token.trim(), get(conf, FAILPOINT));
    }

    private static String get(Configuration conf, String key) {
        String v = conf.get(key);
        if (v == null || v.isBlank()) {
            v = conf.get("spark.hadoop." + key);
        }
        return v == null || v.isBlank() ? null : v.trim();
    }

    boolean enabled() {
        return url != null;
    }

    String token() {
        return token;
    }

    /** Whether the normalised table root lies under one of the governed prefixes (whole segments). */
    boolean governs(String normalisedRoot) {
        for (String prefix : roots) {
            if (normalisedRoot.equals(prefix) || normalisedRoot.startsWith(prefix + "/")) {
                return true;
            }
        }
        return false;
    }

    /**
     * The service's normalisation of a root: {@code s3a://} and {@code s3n://} are {@code s3://};
     * {@code file:} URIs and local paths are absolute {@code file:///} URIs; no trailing slash.
     */
    static String normalise(String location) {
        URI uri = new Path(location.trim()).toUri();
        String scheme = uri.getScheme() == null ? "file" : uri.getScheme().toLowerCase(Locale.ROOT);
        String out;
        if (scheme.equals("file")) {
            String p = uri.getPath() == null ? "/" : uri.getPath();
            if (!p.startsWith("/")) {
                p = new File(p).getAbsolutePath();
            }
            out = "file://" + p;
        } else {
            if (scheme.equals("s3a") || scheme.equals("s3n")) {
                scheme = "s3";
            }
            String authority = uri.getAuthority() == null ? "" : uri.getAuthority();
            out = scheme + "://" + authority + (uri.getPath() == null ? "" : uri.getPath());
        }
        while (out.endsWith("/") && !out.endsWith("://")) {
            out = out.substring(0, out.length() - 1);
        }
        return out;
    }

    @Override
    public String toString() { // no token
        return "url=" + url + ", roots=" + roots + ", outside=" + (refuseOutside ? "refuse" : "passthrough")
            + ", timeoutMs=" + timeoutMs + ", retries=" + retries + ", token=" + (token == null ? "unset" : "set");
    }
}
