package io.github.deltamirror.logstore;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * {@code delta.mirror.commit.url} as a list of replicas over one store: which replica is asked,
 * and how a commit whose answer was lost on one is decided on another (exactly once).
 */
class ReplicaFailoverTest {
    @TempDir
    java.nio.file.Path tmp;

    /** The store both replicas commit into. */
    final Map<Long, byte[]> store = Collections.synchronizedMap(new TreeMap<>());
    StubService a;
    StubService b;
    Configuration conf;
    SqlAuthorityLogStore logStore;
    java.nio.file.Path logDir;
    /** Held here: LogManager keeps loggers weakly, a collected one would come back without the handler. */
    final Logger clientLog = Logger.getLogger("io.github.deltamirror.logstore");
    final List<String> logged = Collections.synchronizedList(new ArrayList<>());
    final Handler capture = new Handler() {
        @Override
        public void publish(LogRecord r) {
            logged.add(r.getLevel() + " " + r.getMessage());
        }

        @Override
        public void flush() {
        }

        @Override
        public void close() {
        }
    };

    static final List<String> ACTIONS = SqlAuthorityLogStoreTest.ACTIONS;
    static final byte[] OURS = SqlAuthorityLogStoreTest.expectedBytes(ACTIONS);
    static final String TOKEN = "s3cr3t-token";

    @BeforeEach
    void setUp() throws IOException {
        a = new StubService(store);
        b = new StubService(store);
        logDir = tmp.resolve("lake").resolve("sales").resolve("_delta_log");
        Files.createDirectories(logDir);
        conf = new Configuration();
        conf.set(Settings.URL, a.url + ", " + b.url + "/");
        conf.set(Settings.ROOTS, "file://" + tmp.resolve("lake"));
        conf.set(Settings.RETRIES, "3");
        conf.set(Settings.TOKEN, TOKEN);
        logStore = new SqlAuthorityLogStore(conf);
        clientLog.addHandler(capture);
    }

    @AfterEach
    void tearDown() {
        clientLog.removeHandler(capture);
        a.close();
        b.close();
    }

    Path logFile(long v) {
        return new Path(logDir.resolve(SqlAuthorityLogStoreTest.name(v)).toUri());
    }

    void write(long v) throws IOException {
        logStore.write(logFile(v), ACTIONS.iterator(), false, conf);
    }

    byte[] published(long v) throws IOException {
        return Files.readAllBytes(logDir.resolve(SqlAuthorityLogStoreTest.name(v)));
    }

    boolean isPublished(long v) {
        return Files.exists(logDir.resolve(SqlAuthorityLogStoreTest.name(v)));
    }

    // ---------------------------------------------------------------------------------------------
    // the setting

    @Test
    void urlListIsReadInOrderWithoutRepeatsAndASingleUrlStaysValid() throws IOException {
        Configuration c = new Configuration();
        c.set(Settings.URL, " http://a:1/ , http://b:2//,,http://a:1 ");
        Settings s = Settings.from(c);
        assertEquals(List.of("http://a:1", "http://b:2"), s.checkedUrls());
        assertEquals("http://a:1,http://b:2", s.url);
        c.set(Settings.URL, "http://x:8787/");
        s = Settings.from(c);
        assertEquals(List.of("http://x:8787"), s.checkedUrls());
        assertEquals("http://x:8787", s.url);
    }

    @Test
    void credentialsInAUrlAreNeverShown() {
        assertEquals("http://***@a:1,http://b:2/p@x", Settings.redact("http://user:pw@a:1,http://b:2/p@x"));
        Configuration c = new Configuration();
        c.set(Settings.URL, "http://user:pw@a:1");
        assertFalse(Settings.from(c).toString().contains("pw"), Settings.from(c).toString());
    }

    @Test
    void aBadEntryFailsTheCommitWithOneClearMessageAndSendsNothing() {
        conf.set(Settings.URL, a.url + ",ftp://user:pw@b");
        IOException e = assertThrows(IOException.class, () -> write(0));
        assertTrue(e.getMessage().contains("invalid entry 'ftp://***@b' in delta.mirror.commit.url: not an http:// or"
            + " https:// URL"), e.getMessage());
        conf.set(Settings.URL, " , ");
        e = assertThrows(IOException.class, () -> write(0));
        assertTrue(e.getMessage().contains("delta.mirror.commit.url lists no URL"), e.getMessage());
        assertEquals(0, a.requests.size());
        assertFalse(isPublished(0));
    }

    // ---------------------------------------------------------------------------------------------
    // which replica

    @Test
    void aDeadFirstReplicaIsSkippedAndLoggedWithoutTheToken() throws IOException {
        a.close(); // nothing listens there: connection refused
        write(0);
        write(1);
        assertEquals(2, b.posts());
        assertArrayEquals(OURS, published(1));
        assertTrue(logged.stream().anyMatch(l -> l.startsWith("WARNING") && l.contains("replica " + a.url + " failed")
            && l.contains("ConnectException") && l.contains("trying " + b.url)), logged.toString());
        assertEquals(1, logged.stream().filter(l -> l.startsWith("WARNING")).count(),
            "the working replica stays first: " + logged);
        assertFalse(logged.toString().contains(TOKEN));
    }

    @Test
    void theReplicaThatAnsweredLastIsAskedFirstUntilItFails() throws IOException {
        a.script(503, "unavailable", "the replica is going away");
        write(0); // a: 503, then b at once
        write(1);
        write(2);
        assertEquals(1, a.requests.size());
        assertEquals(List.of(0L, 1L, 2L), List.copyOf(store.keySet()));
        b.close();
        write(3); // b: refused, back to a
        assertEquals(2, a.posts());
        for (long v = 0; v <= 3; v++) {
            assertArrayEquals(OURS, published(v));
        }
    }

    @Test
    void readsFailOverToo() throws IOException {
        for (long v = 0; v < 3; v++) {
            store.put(v, ("{\"commitInfo\":{\"v\":" + v + "}}\n").getBytes(StandardCharsets.UTF_8));
        }
        a.close();
        List<String> names = new ArrayList<>();
        logStore.listFrom(new Path(logDir.resolve(String.format("%020d", 0)).toUri()), conf)
            .forEachRemaining(s -> names.add(s.getPath().getName()));
        assertEquals(3, names.size(), names.toString());
        assertArrayEquals(store.get(2L), published(2));
    }

    @Test
    void everyReplicaDownFailsNamingEachAndWritesNothing() {
        a.close();
        b.close();
        conf.set(Settings.RETRIES, "2");
        IOException e = assertThrows(IOException.class, () -> write(0));
        assertEquals(IOException.class, e.getClass()); // what Delta and users have always seen
        assertTrue(e.getMessage().contains("the commit service at every replica (" + a.url + ", " + b.url
            + ") is unreachable after 4 attempt(s)"), e.getMessage());
        assertFalse(e.getMessage().contains("may have been committed"), e.getMessage()); // nothing was sent
        assertFalse(e.getMessage().contains(TOKEN));
        assertFalse(logged.toString().contains(TOKEN));
        assertFalse(isPublished(0));
    }

    // ---------------------------------------------------------------------------------------------
    // a lost answer: exactly once

    @Test
    void aCommitWhoseAnswerWasLostIsOursOnTheOtherReplica() throws IOException {
        a.dropAfterCommit = 1; // a commits, then dies before answering
        write(0); // b answers 200 existing
        assertTrue(logged.contains("INFO delta-mirror: version 0 of file:" + logDir.getParent()
            + " was committed by an attempt whose answer was lost (HTTP 200 existing from " + b.url + ")"),
            logged.toString());
        assertEquals(1, store.size());
        assertEquals(1, a.posts());
        assertEquals(1, b.posts());
        assertArrayEquals(OURS, published(0));
    }

    @Test
    void aConflictForOurOwnBytesAfterALostAnswerIsOurs() throws IOException {
        // a service that answers 409 (not 200 existing) to a re-POST of the same bytes
        a.dropAfterCommit = 1;
        b.script(409, "version_taken", "version 0 of t was committed by another writer");
        write(0);
        assertArrayEquals(OURS, published(0));
        assertEquals(List.of("POST", "GET"), b.requests.stream().map(r -> r.split(" ")[0]).toList());
    }

    @Test
    void anotherWritersVersionIsStillAConflictAfterALostAnswer() throws IOException {
        byte[] winner = "{\"commitInfo\":{\"by\":\"winner\"}}\n".getBytes(StandardCharsets.UTF_8);
        store.put(0L, winner);
        a.dropBeforeCommit = 1;
        assertThrows(FileAlreadyExistsException.class, () -> write(0));
        assertArrayEquals(winner, published(0));
        assertArrayEquals(winner, store.get(0L));
    }

    @Test
    void aRefusalAfterALostAnswerIsOursOnlyWhenTheStoreHoldsOurBytes() throws IOException {
        a.dropAfterCommit = 1;
        b.script(423, "halted", "table sales is halted");
        write(0); // the store holds our bytes at 0: committed by the lost attempt
        assertArrayEquals(OURS, published(0));

        b.dropBeforeCommit = 1; // b is asked first now; nothing committed this time
        a.script(423, "halted", "table sales is halted");
        IOException e = assertThrows(IOException.class, () -> write(1));
        assertTrue(e.getMessage().contains("HTTP 423 halted: table sales is halted"), e.getMessage());
        assertFalse(isPublished(1));
        assertEquals(1, store.size());
    }

    @Test
    void aLostAnswerWithNoLaterAnswerSaysTheCommitMayHaveHappenedAndListingFinishesIt() throws IOException {
        conf.set(Settings.RETRIES, "1");
        a.dropAfterCommit = 1;
        b.script(503, "unavailable", "the store is busy");
        IOException e = assertThrows(IOException.class, () -> write(0));
        assertTrue(e.getMessage().contains("HTTP 503 unavailable"), e.getMessage());
        assertTrue(e.getMessage().contains("version 0 may have been committed"), e.getMessage());
        assertFalse(isPublished(0));
        logStore.listFrom(new Path(logDir.resolve(String.format("%020d", 0)).toUri()), conf)
            .forEachRemaining(s -> { });
        assertArrayEquals(OURS, published(0));
    }

    @Test
    void aSingleUrlBehavesAsBefore() throws IOException {
        conf.set(Settings.URL, a.url);
        a.script(503, "unavailable", "busy");
        write(0);
        assertEquals(2, a.posts()); // retried on the one replica
        assertEquals(0, b.requests.size());
    }
}
