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
import java.util.Iterator;
import java.util.List;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.Path;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class SqlAuthorityLogStoreTest {
    @TempDir
    java.nio.file.Path tmp;

    StubService stub;
    Configuration conf;
    SqlAuthorityLogStore store;
    java.nio.file.Path table;
    java.nio.file.Path logDir;

    static final List<String> ACTIONS = List.of(
        "{\"commitInfo\":{\"operation\":\"WRITE\",\"note\":\"caf\u00e9\"}}",
        "{\"add\":{\"path\":\"part-0.parquet\",\"size\":1,\"dataChange\":true}}");

    @BeforeEach
    void setUp() throws IOException {
        stub = new StubService();
        table = tmp.resolve("lake").resolve("sales");
        logDir = table.resolve("_delta_log");
        Files.createDirectories(logDir);
        conf = new Configuration();
        conf.set(Settings.URL, stub.url);
        // governed through the other spelling of a file URI (file:/// vs the file:/ Hadoop writes)
        conf.set(Settings.ROOTS, "file://" + tmp.resolve("lake") + "/");
        conf.set(Settings.RETRIES, "4");
        store = new SqlAuthorityLogStore(conf);
    }

    @AfterEach
    void tearDown() {
        stub.close();
    }

    static String name(long v) {
        return String.format("%020d.json", v);
    }

    Path hadoopPath(java.nio.file.Path p) {
        return new Path(p.toUri()); // file:/... as Delta names it
    }

    Path logFile(long v) {
        return hadoopPath(logDir.resolve(name(v)));
    }

    static byte[] expectedBytes(List<String> actions) {
        StringBuilder sb = new StringBuilder();
        for (String a : actions) {
            sb.append(a).append('\n');
        }
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }

    @Test
    void createdWritesTheCommittedBytes() throws IOException {
        store.write(logFile(0), ACTIONS.iterator(), false, conf);
        byte[] expected = expectedBytes(ACTIONS);
        assertArrayEquals(expected, Files.readAllBytes(logDir.resolve(name(0))));
        assertArrayEquals(expected, stub.commits.get(0L));
        // the root as Hadoop names it (the service normalises it)
        assertEquals("POST /v1/commits/0 file:" + table, stub.requests.get(0));
        // no temporary file left behind
        try (var files = Files.list(logDir)) {
            assertEquals(List.of(name(0)), files.map(p -> p.getFileName().toString()).toList());
        }
    }

    @Test
    void versionTakenWritesTheWinnerThenThrows() throws IOException {
        byte[] winner = "{\"commitInfo\":{\"by\":\"winner\"}}\n".getBytes(StandardCharsets.UTF_8);
        stub.commits.put(0L, winner);
        assertThrows(FileAlreadyExistsException.class, () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertArrayEquals(winner, Files.readAllBytes(logDir.resolve(name(0))));
        assertEquals(List.of("POST", "GET"), stub.requests.stream().map(r -> r.split(" ")[0]).toList());
    }

    @Test
    void versionTakenByOurOwnBytesIsOurCommit() throws IOException {
        // the service answered 409 although v holds exactly our bytes (an earlier attempt of ours):
        // throwing would make Delta commit the same transaction again at v+1
        stub.commits.put(0L, expectedBytes(ACTIONS));
        stub.script(409, "version_taken", "version 0 of t was committed by another writer");
        store.write(logFile(0), ACTIONS.iterator(), false, conf);
        assertArrayEquals(expectedBytes(ACTIONS), Files.readAllBytes(logDir.resolve(name(0))));
    }

    @Test
    void refusalsRaiseTheServiceMessageAndWriteNothing() {
        conf.set(Settings.TOKEN, "s3cr3t-token");
        stub.script(423, "halted", "table sales is halted (CONFLICT at version 3): run delta-mirror resume");
        IOException halted = assertThrows(IOException.class,
            () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertTrue(halted.getMessage().startsWith("delta-mirror: commit of version 0 of "), halted.getMessage());
        assertTrue(halted.getMessage().contains("HTTP 423 halted: table sales is halted (CONFLICT at version 3)"),
            halted.getMessage());
        assertFalse(halted instanceof FileAlreadyExistsException);

        stub.script(422, "invalid", "remove of part-9.parquet, which is not active");
        IOException invalid = assertThrows(IOException.class,
            () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertTrue(invalid.getMessage().contains("HTTP 422 invalid: remove of part-9.parquet"), invalid.getMessage());

        assertFalse(Files.exists(logDir.resolve(name(0))));
        assertEquals(2, stub.posts()); // refusals are not retried
        assertEquals(List.of("Bearer s3cr3t-token", "Bearer s3cr3t-token"), stub.authorizations);
        assertFalse(halted.getMessage().contains("s3cr3t") || invalid.getMessage().contains("s3cr3t"));
    }

    @Test
    void unavailableIsRetriedUntilCommitted() throws IOException {
        stub.script(503, "unavailable", "the store is busy");
        stub.script(503, "unavailable", "the store is busy");
        store.write(logFile(0), ACTIONS.iterator(), false, conf);
        assertEquals(3, stub.posts());
        assertArrayEquals(expectedBytes(ACTIONS), Files.readAllBytes(logDir.resolve(name(0))));
    }

    @Test
    void unavailableBeyondTheRetriesFails() {
        conf.set(Settings.RETRIES, "2");
        for (int i = 0; i < 3; i++) {
            stub.script(503, "unavailable", "the store is busy");
        }
        IOException e = assertThrows(IOException.class, () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertTrue(e.getMessage().contains("HTTP 503 unavailable: the store is busy (after 2 attempts)"), e.getMessage());
        assertEquals(2, stub.posts());
        assertFalse(Files.exists(logDir.resolve(name(0))));
    }

    @Test
    void lostResponseIsResolvedByPostingAgain() throws IOException {
        conf.set(Settings.TIMEOUT_MS, "300");
        stub.stallNextCommits = 1;
        store.write(logFile(0), ACTIONS.iterator(), false, conf);
        assertEquals(2, stub.posts()); // the second answer is 200 "existing"
        assertArrayEquals(expectedBytes(ACTIONS), Files.readAllBytes(logDir.resolve(name(0))));
    }

    @Test
    void unreachableServiceFailsClearlyAndWritesNothing() throws IOException {
        stub.close();
        conf.set(Settings.RETRIES, "2");
        conf.set(Settings.TOKEN, "s3cr3t-token");
        IOException e = assertThrows(IOException.class, () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertTrue(e.getMessage().contains("the commit service at " + stub.url + " is unreachable after 2 attempt(s)"),
            e.getMessage());
        assertFalse(e.getMessage().contains("s3cr3t"));
        assertFalse(Files.exists(logDir.resolve(name(0))));
    }

    @Test
    void existingDifferentFileIsAConflict() throws IOException {
        Files.write(logDir.resolve(name(0)), "{\"external\":true}\n".getBytes(StandardCharsets.UTF_8));
        IOException e = assertThrows(SqlAuthorityLogStore.ConflictException.class,
            () -> store.write(logFile(0), ACTIONS.iterator(), false, conf));
        assertTrue(e.getMessage().contains("halted as CONFLICT"), e.getMessage());
        // an identical existing file is success
        Files.write(logDir.resolve(name(1)), expectedBytes(ACTIONS));
        store.write(logFile(1), ACTIONS.iterator(), false, conf);
        assertArrayEquals(expectedBytes(ACTIONS), Files.readAllBytes(logDir.resolve(name(1))));
    }

    @Test
    void lastCheckpointOfAGovernedTableIsLeftToThePublisher() throws IOException {
        Path lc = hadoopPath(logDir.resolve("_last_checkpoint"));
        java.nio.file.Path file = logDir.resolve("_last_checkpoint");
        Files.writeString(file, "{\"version\":10,\"size\":4}\n");
        store.write(lc, List.of("{\"version\":20,\"size\":4}").iterator(), true, conf);
        store.write(lc, List.of("{\"version\":5,\"size\":4}").iterator(), true, conf);
        assertEquals("{\"version\":10,\"size\":4}\n", Files.readString(file));
        assertEquals(0, stub.requests.size()); // no commit service involved
    }

    @Test
    void listFromWritesCommittedVersionsMissingOnStorage() throws IOException {
        for (long v = 0; v < 3; v++) {
            stub.commits.put(v, ("{\"commitInfo\":{\"v\":" + v + "}}\n").getBytes(StandardCharsets.UTF_8));
        }
        Files.write(logDir.resolve(name(0)), stub.commits.get(0L));
        List<String> names = new ArrayList<>();
        Iterator<FileStatus> it = store.listFrom(hadoopPath(logDir.resolve(String.format("%020d", 0))), conf);
        it.forEachRemaining(s -> names.add(s.getPath().getName()));
        assertEquals(List.of(name(0), name(1), name(2)), names);
        for (long v = 1; v < 3; v++) {
            assertArrayEquals(stub.commits.get(v), Files.readAllBytes(logDir.resolve(name(v))));
        }
    }

    @Test
    void listFromOfAnUnknownTableOrUnreachableServiceJustLists() throws IOException {
        stub.known = false;
        Files.write(logDir.resolve(name(0)), expectedBytes(ACTIONS));
        Path from = hadoopPath(logDir.resolve(String.format("%020d", 0)));
        List<String> names = new ArrayList<>();
        store.listFrom(from, conf).forEachRemaining(s -> names.add(s.getPath().getName()));
        assertEquals(List.of(name(0)), names);
        stub.close();
        names.clear();
        store.listFrom(from, conf).forEachRemaining(s -> names.add(s.getPath().getName()));
        assertEquals(List.of(name(0)), names);
    }

    @Test
    void ungovernedTablesPassThroughToDeltasDefault() throws IOException {
        java.nio.file.Path other = tmp.resolve("elsewhere").resolve("t").resolve("_delta_log");
        Files.createDirectories(other);
        Path p = hadoopPath(other.resolve(name(0)));
        store.write(p, ACTIONS.iterator(), false, conf);
        assertArrayEquals(expectedBytes(ACTIONS), Files.readAllBytes(other.resolve(name(0))));
        // Delta's own put-if-absent semantics
        assertThrows(FileAlreadyExistsException.class, () -> store.write(p, ACTIONS.iterator(), false, conf));
        // no URL: even the governed roots pass through
        Configuration plain = new Configuration();
        store.write(logFile(0), ACTIONS.iterator(), false, plain);
        assertTrue(Files.exists(logDir.resolve(name(0))));
        assertEquals(0, stub.requests.size());
        List<String> names = new ArrayList<>();
        store.listFrom(hadoopPath(other.resolve(String.format("%020d", 0))), conf)
            .forEachRemaining(s -> names.add(s.getPath().getName()));
        assertTrue(names.contains(name(0)), names.toString());
        assertEquals(0, stub.requests.size());
    }

    @Test
    void outsideRefuseRefusesWritesOutsideTheRoots() throws IOException {
        conf.set(Settings.OUTSIDE, "refuse");
        java.nio.file.Path other = tmp.resolve("elsewhere").resolve("t").resolve("_delta_log");
        Files.createDirectories(other);
        IOException e = assertThrows(IOException.class,
            () -> store.write(hadoopPath(other.resolve(name(0))), ACTIONS.iterator(), false, conf));
        assertTrue(e.getMessage().contains("outside the roots governed by the SQL authority"), e.getMessage());
        assertFalse(Files.exists(other.resolve(name(0))));
    }

    @Test
    void settingsNormaliseRootsLikeTheService() {
        assertEquals("file:///data/sales", Settings.normalise("file:/data/sales"));
        assertEquals("file:///data/sales", Settings.normalise("file:///data/sales/"));
        assertEquals("file:///data/sales", Settings.normalise("/data/sales"));
        assertEquals("s3://lake/sales", Settings.normalise("s3a://lake/sales/"));
        assertEquals("s3://lake/sales", Settings.normalise("s3n://lake/sales"));
        Configuration c = new Configuration();
        c.set(Settings.URL, "http://x/");
        c.set("spark.hadoop." + Settings.ROOTS, "s3://lake/, file:/data");
        Settings s = Settings.from(c);
        assertEquals("http://x", s.url);
        assertTrue(s.governs(Settings.normalise("s3a://lake/sales")));
        assertTrue(s.governs(Settings.normalise("file:///data/x")));
        assertFalse(s.governs(Settings.normalise("file:///database/x"))); // whole segments
        assertFalse(s.governs(Settings.normalise("s3a://lake2/sales")));
    }

    @Test
    void delegatesAreDeltasDefaultsPerScheme() {
        assertEquals("io.delta.storage.S3SingleDriverLogStore", SqlAuthorityLogStore.defaultLogStoreClass("s3a"));
        assertEquals("io.delta.storage.S3SingleDriverLogStore", SqlAuthorityLogStore.defaultLogStoreClass("S3"));
        assertEquals("io.delta.storage.HDFSLogStore", SqlAuthorityLogStore.defaultLogStoreClass("file"));
        assertEquals("io.delta.storage.AzureLogStore", SqlAuthorityLogStore.defaultLogStoreClass("abfss"));
        assertEquals("io.delta.storage.GCSLogStore", SqlAuthorityLogStore.defaultLogStoreClass("gs"));
    }

    @Test
    void jsonReaderReadsTheServiceAnswers() {
        Object v = Json.parse("{\"table\": \"t\\u00e9\", \"version\": null, \"n\": [1, 2.5, true], \"s\": \"a\\\"b\"}");
        assertEquals("{table=t\u00e9, version=null, n=[1, 2.5, true], s=a\"b}", v.toString());
        assertEquals(null, Json.parseObjectOrNull("{\"version\":12"));
        assertThrows(IllegalArgumentException.class, () -> Json.parse("{} x"));
    }
}
