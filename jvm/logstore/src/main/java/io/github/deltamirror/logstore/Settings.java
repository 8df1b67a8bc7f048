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

    /**
     * The setting, or null: every table passes through. It names the replicas of one service in
     * failover order, comma-separated (a single URL is a list of one); here as {@link #urls} joined.
     */
    final String url;
    /** The replicas' base URLs, without trailing slashes, duplicates and empty entries. */
    final List<String> urls;
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
        this.urls = url == null ? List.of() : parseUrls(url);
        this.url = url == null || urls.isEmpty() ? url : String.join(",", urls);
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

    /** A URL set (even one without a usable entry: its commits then fail, they never pass through). */
    boolean enabled() {
        return url != null;
    }

    /**
     * The entries of a comma-separated URL list: trimmed, trailing slashes removed, empty entries
     * and repeats skipped, in their order (the failover order). Not validated here: see
     * {@link #checkedUrls}.
     */
    static List<String> parseUrls(String list) {
        List<String> out = new ArrayList<>();
        for (String raw : list.split(",")) {
            String u = raw.trim();
            while (u.endsWith("/")) {
                u = u.substring(0, u.length() - 1);
            }
            if (!u.isEmpty() && !out.contains(u)) {
                out.add(u);
            }
        }
        return Collections.unmodifiableList(out);
    }

    /** {@link #urls}, each an absolute http(s) URL with a host, else one clear IOException. */
    List<String> checkedUrls() throws java.io.IOException {
        if (urls.isEmpty()) {
            throw new java.io.IOException("delta-mirror: " + URL + " lists no URL ('" + redact(url)
                + "'): set it to the commit service's URL, or several replicas' URLs separated by commas");
        }
        for (String u : urls) {
            String why = null;
            try {
                URI uri = new URI(u);
                String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(Locale.ROOT);
                if (!scheme.equals("http") && !scheme.equals("https")) {
                    why = "not an http:// or https:// URL";
                } else if (uri.getHost() == null) {
                    why = "no host";
                } else if (uri.getRawQuery() != null || uri.getRawFragment() != null) {
                    why = "a base URL has no query or fragment";
                }
            } catch (java.net.URISyntaxException e) {
                why = e.getReason();
            }
            if (why != null) {
                throw new java.io.IOException("delta-mirror: invalid entry '" + redact(u) + "' in " + URL + ": "
                    + why + " (expected http://host:port, several separated by commas)");
            }
        }
        return urls;
    }

    /** {@code url} without a user and password ({@code http://***@host}), for messages and logs. */
    static String redact(String url) {
        if (url == null) {
            return null;
        }
        StringBuilder out = new StringBuilder();
        for (String part : url.split(",", -1)) {
            if (out.length() > 0) {
                out.append(',');
            }
            int scheme = part.indexOf("://");
            int at = part.lastIndexOf('@');
            int slash = scheme < 0 ? -1 : part.indexOf('/', scheme + 3);
            if (scheme >= 0 && at > scheme && (slash < 0 || at < slash)) {
                out.append(part, 0, scheme + 3).append("***").append(part.substring(at));
            } else {
                out.append(part);
            }
        }
        return out.toString();
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
        return "url=" + redact(url) + ", roots=" + roots + ", outside=" + (refuseOutside ? "refuse" : "passthrough")
            + ", timeoutMs=" + timeoutMs + ", retries=" + retries + ", token=" + (token == null ? "unset" : "set");
    }
}
