package io.github.deltamirror.logstore;

import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.Deque;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

/**
 * A stand-in for `delta-mirror serve` following docs/commit-service.md for one table: commits are
 * kept in memory; scripted answers (503s, refusals, a lost response) come first.
 */
final class StubService implements AutoCloseable {
    final HttpServer server;
    final String url;
    /** The store: shared by replicas of one service (see {@link #StubService(Map)}). */
    final Map<Long, byte[]> commits;
    final List<String> requests = Collections.synchronizedList(new ArrayList<>());
    final List<String> authorizations = Collections.synchronizedList(new ArrayList<>());
    /** Statuses answered to the next POSTs instead of handling them, with the code and message. */
    final Deque<Object[]> scripted = new ArrayDeque<>();
    /** POSTs that are committed but whose answer comes only after this many ms (a lost response). */
    volatile int stallNextCommits;
    volatile long stallMs = 2_000;
    /** POSTs answered by closing the connection: committed first (a replica killed after the store's commit). */
    volatile int dropAfterCommit;
    /** POSTs answered by closing the connection without committing (a replica killed before it). */
    volatile int dropBeforeCommit;
    /** Whether GET /v1/latest knows the table before its first commit. */
    volatile boolean known = true;
    private final ExecutorService pool = Executors.newCachedThreadPool();

    StubService() throws IOException {
        this(Collections.synchronizedMap(new TreeMap<>()));
    }

    /** A replica over {@code store} (a synchronized map), e.g. another StubService's {@link #commits}. */
    StubService(Map<Long, byte[]> store) throws IOException {
        commits = store;
        server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
        server.createContext("/", this::handle);
        server.setExecutor(pool);
        server.start();
        url = "http://127.0.0.1:" + server.getAddress().getPort();
    }

    synchronized void script(int status, String code, String message) {
        scripted.add(new Object[] {status, code, message});
    }

    long posts() {
        synchronized (requests) {
            return requests.stream().filter(r -> r.startsWith("POST ")).count();
        }
    }

    private void handle(HttpExchange ex) throws IOException {
        try (ex) {
            String method = ex.getRequestMethod();
            String path = ex.getRequestURI().getPath();
            String query = ex.getRequestURI().getRawQuery();
            String root = query != null && query.startsWith("root=")
                ? URLDecoder.decode(query.substring(5), StandardCharsets.UTF_8) : null;
            requests.add(method + " " + path + " " + root);
            authorizations.add(String.valueOf(ex.getRequestHeaders().getFirst("Authorization")));
            byte[] body;
            try (InputStream in = ex.getRequestBody()) {
                body = in.readAllBytes();
            }
            if (method.equals("GET") && path.equals("/v1/latest")) {
                synchronized (commits) {
                    if (commits.isEmpty() && !known) {
                        error(ex, 404, "unknown_table", "no table at " + root);
                    } else {
                        Object v = commits.isEmpty() ? "null" : commits.keySet().stream().max(Long::compare).get();
                        send(ex, 200, ("{\"table\": \"t\", \"version\": " + v + "}").getBytes(StandardCharsets.UTF_8));
                    }
                }
                return;
            }
            if (!path.startsWith("/v1/commits/")) {
                error(ex, 404, "not_found", "no route");
                return;
            }
            long version = Long.parseLong(path.substring("/v1/commits/".length()));
            if (method.equals("GET")) {
                byte[] bytes = commits.get(version);
                if (bytes == null) {
                    error(ex, 404, "not_committed", "version " + version + " is not committed");
                } else {
                    send(ex, 200, bytes);
                }
                return;
            }
            if (dropBeforeCommit > 0) {
                dropBeforeCommit--;
                return; // closing the exchange unanswered closes the connection
            }
            Object[] forced;
            synchronized (this) {
                forced = scripted.poll();
            }
            if (forced != null) {
                error(ex, (Integer) forced[0], (String) forced[1], (String) forced[2]);
                return;
            }
            int status;
            synchronized (commits) {
                byte[] existing = commits.get(version);
                if (existing == null) {
                    commits.put(version, body);
                    status = 201;
                } else {
                    status = Arrays.equals(existing, body) ? 200 : 409;
                }
            }
            if (dropAfterCommit > 0) {
                dropAfterCommit--;
                return;
            }
            if (status == 409) {
                error(ex, 409, "version_taken", "version " + version + " of t was committed by another writer");
                return;
            }
            if (stallNextCommits > 0) {
                stallNextCommits--;
                try {
                    Thread.sleep(stallMs); // the client gives up first: its answer is lost
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                }
            }
            String extra = status == 200 ? ", \"existing\": true" : "";
            send(ex, status, ("{\"table\": \"t\", \"version\": " + version + ", \"sha256\": \"x\", \"size\": "
                + body.length + extra + "}").getBytes(StandardCharsets.UTF_8));
        }
    }

    private static void error(HttpExchange ex, int status, String code, String message) throws IOException {
        if (status == 503) {
            ex.getResponseHeaders().add("Retry-After", "0");
        }
        send(ex, status, ("{\"error\": \"" + message + "\", \"code\": \"" + code + "\"}")
            .getBytes(StandardCharsets.UTF_8));
    }

    private static void send(HttpExchange ex, int status, byte[] body) throws IOException {
        ex.sendResponseHeaders(status, body.length == 0 ? -1 : body.length);
        if (body.length > 0) {
            try (OutputStream out = ex.getResponseBody()) {
                out.write(body);
            } catch (IOException e) {
                // the client went away (a lost response)
            }
        }
    }

    @Override
    public void close() {
        server.stop(0);
        pool.shutdownNow();
    }
}
