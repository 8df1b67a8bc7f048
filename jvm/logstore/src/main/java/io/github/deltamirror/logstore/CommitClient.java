package io.github.deltamirror.logstore;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpConnectTimeoutException;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * The HTTP side of docs/commit-service.md: one call per route, over the replicas of
 * {@code delta.mirror.commit.url}, with bounded retries.
 *
 * <p>Failover: a call tries the replica that answered last (sticky per URL list, so a healthy pair
 * does not alternate), and on a connection error, a timeout or a 502/503/504 the next one at once;
 * after a round in which every replica failed it backs off (100 ms doubling to 5 s, or the
 * service's longer Retry-After within 5 s), for at most {@code retries} rounds. With one URL that
 * is the single-service behaviour: {@code retries} attempts. Any replica may answer any call: the
 * service is stateless and the store decides (docs/commit-service.md, "Stateless").
 */
final class CommitClient {
    private static final Logger LOG = Logger.getLogger(CommitClient.class.getName());
    static final long BACKOFF_START_MS = 100;
    static final long BACKOFF_CAP_MS = 5_000;

    /** One HttpClient per connect timeout (HttpClient is thread-safe and holds the connection pool). */
    private static final Map<Long, HttpClient> CLIENTS = new ConcurrentHashMap<>();
    /** The index of the replica that answered last, per URL list ({@link Settings#url}). */
    private static final Map<String, AtomicInteger> PREFERRED = new ConcurrentHashMap<>();

    /** A status and body; {@code retryAfterMs} from {@code Retry-After} seconds, or -1. */
    static final class Response {
        final int status;
        final byte[] body;
        final long retryAfterMs;
        /** Which replica answered (base URL, no credentials). */
        String replica;
        /**
         * A POST of this call was sent to a replica that then gave no usable answer (lost, timed
         * out, 502/503/504): that attempt may have committed. See SqlAuthorityLogStore#commit.
         */
        boolean afterLostAnswer;

        Response(int status, byte[] body, long retryAfterMs) {
            this.status = status;
            this.body = body;
            this.retryAfterMs = retryAfterMs;
        }

        Map<String, Object> json() {
            return Json.parseObjectOrNull(new String(body, StandardCharsets.UTF_8));
        }

        /** "HTTP 423 halted: <the service's one-line message>" (never a token: the service has none to echo). */
        String describe() {
            Map<String, Object> obj = json();
            String code = null;
            String message = null;
            if (obj != null) {
                Object c = obj.get("code");
                Object e = obj.get("error");
                code = c instanceof String ? (String) c : null;
                message = e instanceof String ? (String) e : null;
            }
            if (message == null) {
                String text = new String(body, StandardCharsets.UTF_8).strip();
                int nl = text.indexOf('\n');
                message = nl >= 0 ? text.substring(0, nl) : text;
                if (message.length() > 300) {
                    message = message.substring(0, 300) + "...";
                }
                if (message.isEmpty()) {
                    message = "(no message)";
                }
            }
            return "HTTP " + status + (code == null ? "" : " " + code) + ": " + message;
        }
    }

    /**
     * All replicas failed in every round, without one answer (connection errors and timeouts only).
     * {@link #afterLostAnswer} as in {@link Response}.
     */
    static final class UnreachableException extends IOException {
        final boolean afterLostAnswer;

        UnreachableException(String message, IOException cause, boolean afterLostAnswer) {
            super(message, cause);
            this.afterLostAnswer = afterLostAnswer;
        }
    }

    /** One request of a call, to the replica at {@code baseUrl}. */
    @FunctionalInterface
    interface Call {
        Response run(String baseUrl) throws IOException;
    }

    private final Settings settings;

    CommitClient(Settings settings) {
        this.settings = settings;
    }

    Response latest(String root, int rounds) throws IOException {
        String what = "reading the latest version of " + root;
        return withFailover(what, rounds, false, base -> send(base, "GET", "/v1/latest?root=" + enc(root), null));
    }

    Response getCommit(long version, String root, int rounds) throws IOException {
        String what = "reading committed version " + version + " of " + root;
        return withFailover(what, rounds, false,
            base -> send(base, "GET", "/v1/commits/" + version + "?root=" + enc(root), null));
    }

    Response postCommit(long version, String root, byte[] bytes, int rounds) throws IOException {
        String what = "commit of version " + version + " of " + root;
        return withFailover(what, rounds, true,
            base -> send(base, "POST", "/v1/commits/" + version + "?root=" + enc(root), bytes));
    }

    /** 502/503/504: the store, the replica or a proxy in front of it is unavailable for now. */
    static boolean isTransient(int status) {
        return status == 502 || status == 503 || status == 504;
    }

    /** The connection was never made, so the request was not sent (no outcome to doubt). */
    static boolean notSent(IOException e) {
        return e instanceof java.net.ConnectException || e instanceof HttpConnectTimeoutException;
    }

    /**
     * Runs {@code call} on the replicas (see the class comment) until one answers something other
     * than a transient status, for at most {@code rounds} rounds. Returns that answer, or the last
     * transient one when every attempt failed; throws {@link UnreachableException} when no replica
     * answered at all. {@code post}: track whether an attempt may have committed
     * ({@link Response#afterLostAnswer}).
     */
    Response withFailover(String what, int rounds, boolean post, Call call) throws IOException {
        List<String> replicas = settings.checkedUrls();
        int k = replicas.size();
        AtomicInteger preferred = PREFERRED.computeIfAbsent(settings.url, u -> new AtomicInteger());
        Map<String, String> failures = new LinkedHashMap<>();
        IOException lastError = null;
        Response lastAnswer = null;
        boolean lost = false;
        int attempts = 0;
        int n = Math.max(1, rounds);
        for (int round = 1; round <= n; round++) {
            int start = Math.floorMod(preferred.get(), k);
            lastAnswer = null;
            for (int j = 0; j < k; j++) {
                int i = (start + j) % k;
                String replica = replicas.get(i);
                String why;
                attempts++;
                try {
                    Response r = call.run(replica);
                    r.replica = Settings.redact(replica);
                    if (!isTransient(r.status)) {
                        r.afterLostAnswer = lost;
                        preferred.set(i);
                        return r;
                    }
                    lastAnswer = r;
                    lost |= post;
                    why = r.describe();
                } catch (InterruptedIOException e) {
                    throw e;
                } catch (IOException e) {
                    lastError = e;
                    lost |= post && !notSent(e);
                    why = e.getMessage() == null && e instanceof java.net.ConnectException
                        ? "connection refused (" + e + ")" : e.toString();
                }
                failures.put(Settings.redact(replica), why);
                if (k > 1) {
                    preferred.compareAndSet(i, (i + 1) % k); // others may have moved on already
                }
                if (LOG.isLoggable(Level.WARNING)) {
                    boolean more = j + 1 < k || round < n;
                    LOG.warning("delta-mirror: " + what + ": the commit service replica "
                        + Settings.redact(replica) + " failed (attempt " + attempts + ", " + why + ")"
                        + (!more ? "; no attempt left"
                            : j + 1 < k ? "; trying " + Settings.redact(replicas.get((i + 1) % k))
                            : "; retrying after a backoff"));
                }
            }
            if (round < n) {
                long wait = Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS << Math.min(round - 1, 20));
                if (lastAnswer != null && lastAnswer.retryAfterMs > wait) {
                    wait = Math.min(BACKOFF_CAP_MS, lastAnswer.retryAfterMs);
                }
                sleep(wait);
            }
        }
        if (lastAnswer != null) {
            lastAnswer.afterLostAnswer = lost;
            return lastAnswer;
        }
        String detail;
        if (k == 1) {
            detail = String.valueOf(lastError);
        } else {
            StringBuilder b = new StringBuilder();
            failures.forEach((r, why) -> b.append(b.length() == 0 ? "" : "; ").append(r).append(": ").append(why));
            detail = "last failures: " + b;
        }
        throw new UnreachableException("delta-mirror: " + what + ": the commit service at "
            + (k == 1 ? Settings.redact(replicas.get(0)) : "every replica (" + String.join(", ",
                failures.keySet()) + ")")
            + " is unreachable after " + attempts + " attempt(s) (" + detail + ")", lastError, lost);
    }

    private static void sleep(long ms) throws InterruptedIOException {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while waiting to retry the commit service");
        }
    }

    private static String enc(String s) {
        return URLEncoder.encode(s, StandardCharsets.UTF_8);
    }

    private Response send(String baseUrl, String method, String route, byte[] body) throws IOException {
        URI uri = URI.create(baseUrl + route); // checked by Settings#checkedUrls
        HttpRequest.Builder b = HttpRequest.newBuilder(uri)
            .timeout(Duration.ofMillis(settings.timeoutMs))
            .header("User-Agent", "delta-mirror-logstore");
        String token = settings.token();
        if (token != null) {
            b.header("Authorization", "Bearer " + token);
        }
        if (body != null) {
            b.header("Content-Type", "application/octet-stream");
            b.method(method, HttpRequest.BodyPublishers.ofByteArray(body));
        } else {
            b.method(method, HttpRequest.BodyPublishers.noBody());
        }
        HttpClient client = CLIENTS.computeIfAbsent(settings.timeoutMs, t -> HttpClient.newBuilder()
            .version(HttpClient.Version.HTTP_1_1)
            .connectTimeout(Duration.ofMillis(t))
            .followRedirects(HttpClient.Redirect.NEVER)
            .build());
        HttpResponse<byte[]> resp;
        try {
            resp = client.send(b.build(), HttpResponse.BodyHandlers.ofByteArray());
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while calling the commit service");
        }
        long retryAfter = -1;
        String ra = resp.headers().firstValue("Retry-After").orElse(null);
        if (ra != null) {
            try {
                retryAfter = Math.max(0, Long.parseLong(ra.trim())) * 1000;
            } catch (NumberFormatException e) {
                // an HTTP date: ignore, the backoff applies
            }
        }
        byte[] bytes = resp.body() == null ? new byte[0] : resp.body();
        return new Response(resp.statusCode(), bytes, retryAfter);
    }
}
