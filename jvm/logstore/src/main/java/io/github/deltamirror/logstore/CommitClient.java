package io.github.deltamirror.logstore;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

/** The HTTP side of docs/commit-service.md: one request per call, plus bounded retries. */
final class CommitClient {
    static final long BACKOFF_START_MS = 100;
    static final long BACKOFF_CAP_MS = 5_000;

    /** One HttpClient per connect timeout (HttpClient is thread-safe and holds the connection pool). */
    private static final Map<Long, HttpClient> CLIENTS = new ConcurrentHashMap<>();

    /** A status and body; {@code retryAfterMs} from {@code Retry-After} seconds, or -1. */
    static final class Response {
        final int status;
        final byte[] body;
        final long retryAfterMs;

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

    @FunctionalInterface
    interface Call {
        Response run() throws IOException;
    }

    private final Settings settings;

    CommitClient(Settings settings) {
        this.settings = settings;
    }

    Response latest(String root) throws IOException {
        return send("GET", "/v1/latest?root=" + enc(root), null);
    }

    Response getCommit(long version, String root) throws IOException {
        return send("GET", "/v1/commits/" + version + "?root=" + enc(root), null);
    }

    Response postCommit(long version, String root, byte[] bytes) throws IOException {
        return send("POST", "/v1/commits/" + version + "?root=" + enc(root), bytes);
    }

    /** 502/503/504: the store or a proxy in front of the service is unavailable for now. */
    static boolean isTransient(int status) {
        return status == 502 || status == 503 || status == 504;
    }

    /**
     * Runs {@code call} until it answers something other than a transient status, at most
     * {@code attempts} times, sleeping 100 ms, 200 ms, ... (capped at 5 s, or the service's
     * Retry-After when longer, within the cap) between attempts. Connection errors and timeouts are
     * transient too. Returns the last answer (possibly still transient), or throws the last
     * connection error.
     */
    Response withRetries(String what, int attempts, Call call) throws IOException {
        IOException lastError = null;
        Response last = null;
        int n = Math.max(1, attempts);
        for (int i = 1; i <= n; i++) {
            try {
                last = call.run();
                lastError = null;
                if (!isTransient(last.status)) {
                    return last;
                }
            } catch (InterruptedIOException e) {
                throw e;
            } catch (IOException e) {
                lastError = e;
                last = null;
            }
            if (i < n) {
                long wait = Math.min(BACKOFF_CAP_MS, BACKOFF_START_MS << Math.min(i - 1, 20));
                if (last != null && last.retryAfterMs > wait) {
                    wait = Math.min(BACKOFF_CAP_MS, last.retryAfterMs);
                }
                sleep(wait);
            }
        }
        if (last != null) {
            return last;
        }
        throw new IOException("delta-mirror: " + what + ": the commit service at " + settings.url
            + " is unreachable after " + n + " attempt(s) (" + lastError + ")", lastError);
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

    private Response send(String method, String route, byte[] body) throws IOException {
        URI uri;
        try {
            uri = URI.create(settings.url + route);
        } catch (IllegalArgumentException e) {
            throw new IOException("delta-mirror: invalid " + Settings.URL + " '" + settings.url + "'", e);
        }
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
