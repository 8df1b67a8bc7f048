package io.github.deltamirror.logstore;

import java.io.ByteArrayOutputStream;
import java.io.File;
import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.FileSystemException;
import java.nio.file.Files;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.ConcurrentHashMap;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.regex.Pattern;

import io.delta.storage.AzureLogStore;
import io.delta.storage.CloseableIterator;
import io.delta.storage.GCSLogStore;
import io.delta.storage.HDFSLogStore;
import io.delta.storage.HadoopFileSystemLogStore;
import io.delta.storage.LogStore;
import io.delta.storage.S3SingleDriverLogStore;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FSDataOutputStreamBuilder;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.LocalFileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;

/**
 * A Delta {@link LogStore} whose commits go through delta-mirror's commit service, so that the SQL
 * store is the authority for the transaction log (docs/commit-service.md).
 *
 * <p>For a table whose root (the parent of {@code _delta_log}) lies under one of
 * {@code delta.mirror.commit.roots} while {@code delta.mirror.commit.url} is set (one URL, or the
 * replicas of the service separated by commas: {@link CommitClient} fails over between them):
 * <ul>
 *   <li>{@code write(<v>.json, overwrite=false)} POSTs Spark's exact bytes; once the service has
 *       committed them (201, or 200 for a retry of the same bytes) {@code <v>.json} is written with
 *       them, put-if-absent; a lost answer is resolved as {@link #commit} says. 409: the winner's {@code <v>.json} is made to exist, then
 *       {@link FileAlreadyExistsException} (Delta re-lists and retries at the next version).</li>
 *   <li>{@code write(_last_checkpoint, overwrite=true)} is left to the publisher: delta-mirror's
 *       publisher is the one writer of the pointer (under the table's lease), so it never moves
 *       backwards; Spark's checkpoint files themselves are written and found by listing as usual.</li>
 *   <li>{@code listFrom} first writes the {@code <v>.json} of versions committed in the store but
 *       missing on storage (a crash between the commit and the file write).</li>
 * </ul>
 * Everything else, and every table outside the governed roots (unless
 * {@code delta.mirror.commit.outside=refuse}), goes to the LogStore Delta itself uses by default
 * for the path's scheme: {@link S3SingleDriverLogStore} for s3/s3a/s3n, {@link AzureLogStore} for
 * the Azure schemes, {@link GCSLogStore} for gs, {@link HDFSLogStore} otherwise (file included).
 */
public class SqlAuthorityLogStore extends HadoopFileSystemLogStore {
    private static final Logger LOG = Logger.getLogger(SqlAuthorityLogStore.class.getName());

    /** Delta's commit files: a 20-digit version and {@code .json}. */
    static final Pattern DELTA_FILE = Pattern.compile("\\d{20}\\.json");
    static final String LOG_DIR = "_delta_log";
    static final String LAST_CHECKPOINT = "_last_checkpoint";
    /** {@code Options.CreateFileOptionKeys.FS_OPTION_CREATE_CONDITIONAL_OVERWRITE} (Hadoop 3.4.2+). */
    static final String CONDITIONAL_CREATE = "fs.option.create.conditional.overwrite";

    private final Map<String, LogStore> delegates = new ConcurrentHashMap<>();

    public SqlAuthorityLogStore(Configuration hadoopConf) {
        super(hadoopConf);
    }

    /** {@code <v>.json} exists with different bytes than the store's version v. */
    public static final class ConflictException extends IOException {
        ConflictException(String message) {
            super(message);
        }
    }

    /** A governed table: its root as Hadoop names it, and the settings of this call. */
    private static final class Target {
        final Path root;
        final String rootText;
        final Settings settings;

        Target(Path root, Settings settings) {
            this.root = root;
            this.rootText = root.toString();
            this.settings = settings;
        }
    }

    // ---------------------------------------------------------------------------------------------
    // delegation

    /** The class of the LogStore Delta uses by default for {@code scheme} (DelegatingLogStore). */
    static String defaultLogStoreClass(String scheme) {
        String s = scheme == null ? "" : scheme.toLowerCase(Locale.ROOT);
        switch (s) {
            case "s3":
            case "s3a":
            case "s3n":
                return S3SingleDriverLogStore.class.getName();
            case "abfs":
            case "abfss":
            case "adl":
            case "wasb":
            case "wasbs":
                return AzureLogStore.class.getName();
            case "gs":
                return GCSLogStore.class.getName();
            default:
                return HDFSLogStore.class.getName();
        }
    }

    LogStore delegateFor(Path path) {
        String cls = defaultLogStoreClass(path.toUri().getScheme());
        return delegates.computeIfAbsent(cls, c -> {
            Configuration conf = initHadoopConf();
            if (c.equals(S3SingleDriverLogStore.class.getName())) {
                return new S3SingleDriverLogStore(conf);
            } else if (c.equals(AzureLogStore.class.getName())) {
                return new AzureLogStore(conf);
            } else if (c.equals(GCSLogStore.class.getName())) {
                return new GCSLogStore(conf);
            }
            return new HDFSLogStore(conf);
        });
    }

    /**
     * The governed table of a path inside {@code _delta_log/}, or null (pass through). When
     * {@code forWrite} and the table is outside the roots with {@code outside=refuse}, refuses.
     */
    private static Target target(Path path, Configuration conf, boolean forWrite) throws IOException {
        Path dir = path.getParent();
        if (dir == null || !LOG_DIR.equals(dir.getName()) || dir.getParent() == null) {
            return null;
        }
        Settings settings = Settings.from(conf);
        if (!settings.enabled()) {
            return null;
        }
        Path root = dir.getParent();
        if (settings.governs(Settings.normalise(root.toString()))) {
            return new Target(root, settings);
        }
        if (forWrite && settings.refuseOutside) {
            throw new IOException("delta-mirror: refusing to write " + path.getName() + " of table " + root
                + ": it is outside the roots governed by the SQL authority (" + Settings.ROOTS + "="
                + String.join(",", settings.roots) + ") and " + Settings.OUTSIDE + "=refuse");
        }
        return null;
    }

    // ---------------------------------------------------------------------------------------------
    // LogStore API

    @Override
    public CloseableIterator<String> read(Path path, Configuration hadoopConf) throws IOException {
        return delegateFor(path).read(path, hadoopConf);
    }

    @Override
    public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration hadoopConf)
            throws IOException {
        Target t = target(path, hadoopConf, true);
        String name = path.getName();
        if (t != null && !overwrite && DELTA_FILE.matcher(name).matches()) {
            commit(t, path, Long.parseLong(name.substring(0, 20)), encode(actions), hadoopConf);
        } else if (t != null && overwrite && LAST_CHECKPOINT.equals(name)) {
            // the publisher owns the pointer in governed roots (one writer: it cannot move back)
            LOG.fine(() -> "delta-mirror: left " + path + " to the publisher");
        } else {
            delegateFor(path).write(path, actions, overwrite, hadoopConf);
        }
    }

    @Override
    public Iterator<FileStatus> listFrom(Path path, Configuration hadoopConf) throws IOException {
        Target t = target(path, hadoopConf, false);
        if (t != null) {
            recoverMissing(t, path.getParent(), hadoopConf);
        }
        return delegateFor(path).listFrom(path, hadoopConf);
    }

    @Override
    public Path resolvePathOnPhysicalStorage(Path path, Configuration hadoopConf) throws IOException {
        return delegateFor(path).resolvePathOnPhysicalStorage(path, hadoopConf);
    }

    @Override
    public Boolean isPartialWriteVisible(Path path, Configuration hadoopConf) throws IOException {
        return delegateFor(path).isPartialWriteVisible(path, hadoopConf);
    }

    // ---------------------------------------------------------------------------------------------
    // commits

    /** Each action plus "\n", UTF-8: the bytes Delta's own LogStores write. */
    static byte[] encode(Iterator<String> actions) {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        while (actions.hasNext()) {
            byte[] line = (actions.next() + "\n").getBytes(StandardCharsets.UTF_8);
            out.write(line, 0, line.length);
        }
        return out.toByteArray();
    }

    /**
     * Commits {@code bytes} as version {@code version} through the service, then writes them as
     * {@code <v>.json}. Exactly once, across replicas and lost answers:
     *
     * <p>A POST sent without a usable answer (the replica died mid-request, a timeout, 502/503/504)
     * may have committed. It is sent again with the same bytes, to the next replica or after a
     * backoff ({@link CommitClient}), and the answer decides:
     * <ul>
     *   <li>201, or 200 {@code existing} (v already holds exactly these bytes: the lost attempt had
     *       committed them): ours; {@code <v>.json} is written.</li>
     *   <li>409: GET v. Exactly our bytes is ours (success: throwing would make Delta commit the
     *       same transaction again at v+1); other bytes are another writer's: their
     *       {@code <v>.json} is written, then {@link FileAlreadyExistsException} (Delta re-lists
     *       and retries at v+1).</li>
     *   <li>Any other refusal after a lost answer (e.g. 423 for a table halted meanwhile): the same
     *       GET; v holding our bytes is ours, anything else is the refusal's IOException.</li>
     *   <li>No answer within the budget: an IOException; after a lost answer it says the commit may
     *       have happened (then the next listing writes {@code <v>.json}, {@link #recoverMissing}).</li>
     * </ul>
     * Byte equality means "ours" because no two transactions write the same bytes: Delta's
     * commitInfo holds the transaction's timestamp and id.
     */
    private void commit(Target t, Path path, long version, byte[] bytes, Configuration conf) throws IOException {
        CommitClient client = new CommitClient(t.settings);
        String what = "commit of version " + version + " of " + t.rootText;
        t.settings.failpoint("delay-before-commit");
        long started = System.nanoTime();
        CommitClient.Response r;
        try {
            r = client.postCommit(version, t.rootText, bytes, t.settings.retries);
        } catch (CommitClient.UnreachableException e) { // a plain IOException to Delta, as ever
            throw new IOException(e.getMessage() + (e.afterLostAnswer ? maybeCommitted(version) : ""), e.getCause());
        }
        switch (r.status) {
            case 200:
            case 201:
                t.settings.failpoint("halt-after-commit");
                publish(path, version, bytes, conf);
                if (r.afterLostAnswer) {
                    LOG.info("delta-mirror: version " + version + " of " + t.rootText + (r.status == 200
                        ? " was committed by an attempt whose answer was lost (HTTP 200 existing from " + r.replica + ")"
                        : " committed through " + r.replica + " (an attempt whose answer was lost had not committed it)"));
                }
                if (LOG.isLoggable(Level.FINE)) {
                    LOG.fine(String.format("delta-mirror: committed version %d of %s through %s (%d bytes, HTTP %d, %d ms)",
                        version, t.rootText, r.replica, bytes.length, r.status, (System.nanoTime() - started) / 1_000_000));
                }
                return;
            case 409: {
                byte[] winner = fetchCommit(client, t, version, t.settings.retries);
                if (Arrays.equals(winner, bytes)) {
                    // the store holds exactly our bytes: ours won (an earlier attempt's answer was lost)
                    publish(path, version, bytes, conf);
                    LOG.info(() -> "delta-mirror: version " + version + " of " + t.rootText
                        + " already held our bytes after a 409: our earlier attempt had committed it");
                    return;
                }
                publish(path, version, winner, conf);
                LOG.fine(() -> "delta-mirror: version " + version + " of " + t.rootText + " taken by another writer");
                throw new FileAlreadyExistsException(path.toString());
            }
            default: {
                boolean gaveUp = CommitClient.isTransient(r.status);
                if (r.afterLostAnswer && !gaveUp) {
                    byte[] held;
                    try {
                        held = heldAt(client, t, version);
                    } catch (java.io.InterruptedIOException e) {
                        throw e;
                    } catch (IOException e) {
                        throw new IOException("delta-mirror: " + what + " failed: " + r.describe()
                            + " after an attempt whose answer was lost, and checking the store failed too ("
                            + e.getMessage() + ")" + maybeCommitted(version), e);
                    }
                    if (held != null && Arrays.equals(held, bytes)) {
                        publish(path, version, bytes, conf);
                        LOG.info(() -> "delta-mirror: version " + version + " of " + t.rootText + " holds our bytes"
                            + " (an attempt whose answer was lost had committed it); later answer: " + r.describe());
                        return;
                    }
                }
                int replicas = t.settings.urls.size();
                throw new IOException("delta-mirror: " + what + " failed: " + r.describe()
                    + (gaveUp ? (replicas == 1 ? " (after " + t.settings.retries + " attempts)"
                        : " (after " + t.settings.retries + " rounds over " + replicas + " replicas)") : "")
                    + (gaveUp && r.afterLostAnswer ? maybeCommitted(version) : ""));
            }
        }
    }

    private static String maybeCommitted(long version) {
        return "; an earlier attempt's answer was lost, so version " + version + " may have been committed:"
            + " the next listing of the table writes its file if so";
    }

    /** The bytes the store holds at {@code version}, or null when it is not committed (404). */
    private static byte[] heldAt(CommitClient client, Target t, long version) throws IOException {
        CommitClient.Response r = client.getCommit(version, t.rootText, t.settings.retries);
        if (r.status == 404) {
            return null;
        }
        if (r.status != 200) {
            throw new IOException("delta-mirror: reading committed version " + version + " of " + t.rootText
                + " failed: " + r.describe());
        }
        return r.body;
    }

    private static byte[] fetchCommit(CommitClient client, Target t, long version, int rounds) throws IOException {
        String what = "reading committed version " + version + " of " + t.rootText;
        CommitClient.Response r = client.getCommit(version, t.rootText, rounds);
        if (r.status != 200) {
            throw new IOException("delta-mirror: " + what + " failed: " + r.describe());
        }
        return r.body;
    }

    /**
     * Makes {@code <v>.json} exist with {@code bytes}, never replacing a file: an identical existing
     * file is success, a different one a {@link ConflictException}.
     */
    static void publish(Path path, long version, byte[] bytes, Configuration conf) throws IOException {
        FileSystem fs = path.getFileSystem(conf);
        if (fs instanceof LocalFileSystem || fs instanceof RawLocalFileSystem) {
            publishLocal(path, new File(fs.makeQualified(path).toUri()).toPath(), version, bytes);
        } else {
            publishObject(fs, path, version, bytes);
        }
    }

    /** Temp file + hard link: atomic, complete, and fails when the target exists. */
    private static void publishLocal(Path path, java.nio.file.Path target, long version, byte[] bytes)
            throws IOException {
        Files.createDirectories(target.getParent());
        java.nio.file.Path tmp = target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
        try {
            try (FileChannel ch = FileChannel.open(tmp, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
                ByteBuffer buf = ByteBuffer.wrap(bytes);
                while (buf.hasRemaining()) {
                    ch.write(buf);
                }
                ch.force(true);
            }
            try {
                Files.createLink(target, tmp);
            } catch (FileAlreadyExistsException e) {
                checkExisting(path, version, Files.readAllBytes(target), bytes);
            } catch (UnsupportedOperationException | FileSystemException e) {
                // no hard links on this file system: exclusive create (atomic existence check)
                try (FileChannel ch = FileChannel.open(target, StandardOpenOption.CREATE_NEW, StandardOpenOption.WRITE)) {
                    ByteBuffer buf = ByteBuffer.wrap(bytes);
                    while (buf.hasRemaining()) {
                        ch.write(buf);
                    }
                    ch.force(true);
                } catch (FileAlreadyExistsException again) {
                    checkExisting(path, version, Files.readAllBytes(target), bytes);
                }
            }
        } finally {
            Files.deleteIfExists(tmp);
        }
    }

    /**
     * Object stores: S3A's conditional create (If-None-Match: *) when the file system declares it,
     * else an existence check then {@code create(path, overwrite=false)}. The window of the latter
     * is harmless between delta-mirror writers: whoever writes {@code <v>.json} writes the bytes the
     * store committed for v.
     */
    private static void publishObject(FileSystem fs, Path path, long version, byte[] bytes) throws IOException {
        if (fs.exists(path)) {
            checkExisting(path, version, readAll(fs, path), bytes);
            return;
        }
        boolean conditional;
        try {
            conditional = fs.hasPathCapability(path, CONDITIONAL_CREATE);
        } catch (IOException | RuntimeException e) {
            conditional = false;
        }
        try {
            FSDataOutputStream out;
            if (conditional) {
                FSDataOutputStreamBuilder<FSDataOutputStream, ?> b = fs.createFile(path);
                b.overwrite(false);
                b.must(CONDITIONAL_CREATE, true);
                out = b.build();
            } else {
                out = fs.create(path, false);
            }
            try (FSDataOutputStream o = out) {
                o.write(bytes);
            }
        } catch (IOException e) {
            // 412 from a conditional PUT, or FileAlreadyExistsException: someone wrote it meanwhile
            if (e instanceof ConflictException || !fs.exists(path)) {
                throw e;
            }
            checkExisting(path, version, readAll(fs, path), bytes);
        }
    }

    private static void checkExisting(Path path, long version, byte[] existing, byte[] expected)
            throws ConflictException {
        if (!Arrays.equals(existing, expected)) {
            throw new ConflictException("delta-mirror: " + path + " already exists with different content ("
                + existing.length + " bytes) than version " + version + " committed in the SQL store ("
                + expected.length + " bytes): something wrote this table's log outside the authority; "
                + "the table will be halted as CONFLICT");
        }
    }

    private static byte[] readAll(FileSystem fs, Path path) throws IOException {
        try (InputStream in = fs.open(path)) {
            return in.readAllBytes();
        }
    }

    // ---------------------------------------------------------------------------------------------
    // _last_checkpoint


    // ---------------------------------------------------------------------------------------------
    // recovery

    /**
     * Writes the {@code <v>.json} of versions the store committed above the highest one on storage.
     * Best effort against an unreachable service (one round over the replicas; the listing goes on, and a later
     * commit at a taken version is still answered 409 by the service); a conflicting existing file
     * is an error.
     */
    private void recoverMissing(Target t, Path logDir, Configuration conf) throws IOException {
        CommitClient client = new CommitClient(t.settings);
        long latest;
        try {
            CommitClient.Response r = client.latest(t.rootText, 1);
            if (r.status == 404) {
                return; // a table the store does not know (yet): just list
            }
            if (r.status != 200) {
                LOG.warning("delta-mirror: could not check " + t.rootText + " for unpublished commits: " + r.describe());
                return;
            }
            Map<String, Object> obj = r.json();
            Object v = obj == null ? null : obj.get("version");
            if (!(v instanceof Long)) {
                return; // no commit yet
            }
            latest = (Long) v;
        } catch (IOException e) {
            if (e instanceof java.io.InterruptedIOException) {
                throw e;
            }
            LOG.warning("delta-mirror: could not check " + t.rootText + " for unpublished commits: " + e.getMessage());
            return;
        }
        FileSystem fs = logDir.getFileSystem(conf);
        long highest = -1;
        try {
            for (FileStatus f : fs.listStatus(logDir)) {
                String name = f.getPath().getName();
                if (DELTA_FILE.matcher(name).matches()) {
                    highest = Math.max(highest, Long.parseLong(name.substring(0, 20)));
                }
            }
        } catch (FileNotFoundException e) {
            // no _delta_log yet: everything up to latest is missing
        }
        for (long v = highest + 1; v <= latest; v++) {
            byte[] bytes;
            try {
                bytes = fetchCommit(client, t, v, 1);
            } catch (java.io.InterruptedIOException e) {
                throw e;
            } catch (IOException e) {
                LOG.warning("delta-mirror: could not write the missing versions " + v + ".." + latest + " of "
                    + t.rootText + ": " + e.getMessage());
                return;
            }
            publish(new Path(logDir, String.format("%020d.json", v)), v, bytes, conf);
            final long recovered = v;
            LOG.info(() -> "delta-mirror: wrote missing " + String.format("%020d.json", recovered) + " of "
                + t.rootText + " from the SQL store");
        }
    }
}
